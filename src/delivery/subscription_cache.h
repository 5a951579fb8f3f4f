/*
 * subscription_cache.h - per-subscription caches of a delivery worker,
 * keyed by subscription id (subscription_cache.c).
 */
#ifndef EVENTGRID_SUBSCRIPTION_CACHE_H
#define EVENTGRID_SUBSCRIPTION_CACHE_H

#include "core/eventgrid.h"

#include "utils/hsearch.h"

extern void *eg_subscription_cache_entry(HTAB **table, const char *name, Size entrysize, int64 sub_id,
										 TimestampTz set_at, bool *found);

#endif							/* EVENTGRID_SUBSCRIPTION_CACHE_H */
