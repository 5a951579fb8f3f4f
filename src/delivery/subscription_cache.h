/*
 * subscription_cache.h - per-subscription caches of a delivery worker,
 * keyed by subscription id, bounded, least recently used out first
 * (subscription_cache.c).
 */
#ifndef EVENTGRID_SUBSCRIPTION_CACHE_H
#define EVENTGRID_SUBSCRIPTION_CACHE_H

#include "core/eventgrid.h"

#include "lib/ilist.h"
#include "utils/hsearch.h"

/* Entries a cache keeps at most: with more subscriptions, the least recently used goes */
#define EG_SUBSCRIPTION_CACHE_MAX 1024

/* The start of every entry of a cache */
typedef struct EgSubscriptionCacheEntry
{
	int64		subscription_id;	/* hash key */
	dlist_node	lru;			/* in the cache's list, most recently used first */
} EgSubscriptionCacheEntry;

typedef struct EgSubscriptionCache
{
	const char *name;			/* of the hash table */
	Size		entrysize;		/* an entry, EgSubscriptionCacheEntry first */
	void		(*evict) (void *entry); /* releases what an entry holds before it goes */
	HTAB	   *table;			/* made at the first entry */
	dlist_head	lru;
	int			n;
} EgSubscriptionCache;

extern void *eg_subscription_cache_entry(EgSubscriptionCache *cache, int64 sub_id, TimestampTz set_at,
										 bool *found);
extern void eg_subscription_cache_remove(EgSubscriptionCache *cache, int64 sub_id);

#endif							/* EVENTGRID_SUBSCRIPTION_CACHE_H */
