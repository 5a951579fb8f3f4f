/*
 * subscription_cache.c - the per-subscription caches a delivery worker
 * keeps of what its claims name by when it was set: client certificates
 * (delivery_claim.c) and delivery authentication (delivery_auth.c).
 */
#include "delivery/subscription_cache.h"

/*
 * The entry of subscription sub_id in *table, a per-subscription cache of
 * what its claims name by when it was set (set_at; entries start with the
 * subscription id, the hash key): made (and *table with it, named name,
 * entries of entrysize bytes) when set_at is not 0 and there is none
 * (*found false, the rest of the entry unset); NULL when set_at is 0 and
 * there is none.  Client certificates (delivery_claim.c) and delivery authentication
 * (delivery_auth.c).
 */
void *
eg_subscription_cache_entry(HTAB **table, const char *name, Size entrysize, int64 sub_id,
							TimestampTz set_at, bool *found)
{
	*found = false;
	if (*table == NULL)
	{
		HASHCTL		ctl;

		if (set_at == 0)
			return NULL;
		ctl.keysize = sizeof(int64);
		ctl.entrysize = entrysize;
		*table = hash_create(name, 16, &ctl, HASH_ELEM | HASH_BLOBS);
	}
	return hash_search(*table, &sub_id, set_at == 0 ? HASH_FIND : HASH_ENTER, found);
}
