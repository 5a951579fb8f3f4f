/*
 * subscription_cache.h - per-subscription caches of a delivery worker,
 * keyed by subscription id, bounded, least recently used out first, and
 * what they let go of kept until no live claim's request may point at it
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

/*
 * What an entry held and let go of (evicted or replaced) while requests of
 * live claims may still point at it: release(item) is called once every
 * claim alive when it was retired is gone, and frees it (false: not yet,
 * e.g. a token request in flight; it is asked again at the next sweep).
 */
extern void eg_retire(void *item, bool (*release) (void *item));
extern void eg_retired_sweep(void);

#endif							/* EVENTGRID_SUBSCRIPTION_CACHE_H */
