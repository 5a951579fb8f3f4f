/*
 * subscription_cache.c - the per-subscription caches a delivery worker
 * keeps of what its claims name by when it was set: client certificates
 * (delivery_claim.c) and delivery authentication (delivery_auth.c).  Each
 * keeps at most EG_SUBSCRIPTION_CACHE_MAX entries: a worker's memory does
 * not grow with the number of subscriptions (SPEC 20); one evicted is
 * loaded again when a claim names it.  What an evicted or replaced entry
 * held is retired: freed once every claim alive then is gone (their
 * requests point at it), whether or not requests of later claims are in
 * flight, so that a worker that is never idle frees them too.
 */
#include "delivery/subscription_cache.h"
#include "delivery/delivery.h"

#include "utils/memutils.h"

typedef struct EgRetired
{
	void	   *item;
	bool		(*release) (void *item);
	uint64		last_claim;		/* the last claim made when it was retired */
} EgRetired;

static EgRetired *retired = NULL;	/* in TopMemoryContext, oldest first */
static int	retired_n = 0;
static int	retired_cap = 0;

/*
 * The entry of subscription sub_id in cache, made when set_at is not 0 and
 * there is none (*found false, the rest of the entry unset; the least
 * recently used entry is evicted first when the cache is full); NULL when
 * set_at is 0 and there is none.  The entry found or made becomes the most
 * recently used.
 */
void *
eg_subscription_cache_entry(EgSubscriptionCache *cache, int64 sub_id, TimestampTz set_at, bool *found)
{
	EgSubscriptionCacheEntry *e;

	*found = false;
	if (cache->table == NULL)
	{
		HASHCTL		ctl;

		if (set_at == 0)
			return NULL;
		ctl.keysize = sizeof(int64);
		ctl.entrysize = cache->entrysize;
		cache->table = hash_create(cache->name, 16, &ctl, HASH_ELEM | HASH_BLOBS);
		dlist_init(&cache->lru);
		cache->n = 0;
	}
	e = hash_search(cache->table, &sub_id, HASH_FIND, found);
	if (e != NULL)
	{
		dlist_move_head(&cache->lru, &e->lru);
		return e;
	}
	if (set_at == 0)
		return NULL;
	if (cache->n >= EG_SUBSCRIPTION_CACHE_MAX)
	{
		EgSubscriptionCacheEntry *victim = dlist_tail_element(EgSubscriptionCacheEntry, lru, &cache->lru);

		cache->evict(victim);
		eg_subscription_cache_remove(cache, victim->subscription_id);
	}
	e = hash_search(cache->table, &sub_id, HASH_ENTER, found);
	dlist_push_head(&cache->lru, &e->lru);
	cache->n++;
	return e;
}

/* Removes subscription sub_id's entry, if any (what it holds released by the caller). */
void
eg_subscription_cache_remove(EgSubscriptionCache *cache, int64 sub_id)
{
	EgSubscriptionCacheEntry *e;

	if (cache->table == NULL)
		return;
	e = hash_search(cache->table, &sub_id, HASH_FIND, NULL);
	if (e == NULL)
		return;
	dlist_delete(&e->lru);
	hash_search(cache->table, &sub_id, HASH_REMOVE, NULL);
	cache->n--;
}

/* See subscription_cache.h. */
void
eg_retire(void *item, bool (*release) (void *item))
{
	if (retired_n == retired_cap)
	{
		retired_cap = retired_cap == 0 ? 16 : retired_cap * 2;
		retired = retired == NULL
			? MemoryContextAlloc(TopMemoryContext, retired_cap * sizeof(EgRetired))
			: repalloc(retired, retired_cap * sizeof(EgRetired));
	}
	retired[retired_n].item = item;
	retired[retired_n].release = release;
	retired[retired_n].last_claim = eg_dw.claims_made;
	retired_n++;
}

/* See subscription_cache.h: called as each claim is made. */
void
eg_retired_sweep(void)
{
	uint64		oldest = eg_delivery_oldest_claim();
	int			kept = 0;

	for (int i = 0; i < retired_n; i++)
	{
		if (retired[i].last_claim < oldest && retired[i].release(retired[i].item))
			continue;
		retired[kept++] = retired[i];
	}
	retired_n = kept;
}
