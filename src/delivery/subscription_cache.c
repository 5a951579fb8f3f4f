/*
 * subscription_cache.c - the per-subscription caches a delivery worker
 * keeps of what its claims name by when it was set: client certificates
 * (delivery_claim.c) and delivery authentication (delivery_auth.c).  Each
 * keeps at most EG_SUBSCRIPTION_CACHE_MAX entries: a worker's memory does
 * not grow with the number of subscriptions (SPEC 20); one evicted is
 * loaded again when a claim names it.
 */
#include "delivery/subscription_cache.h"

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
