/*
 * store_batch_order.h - where an ordered subscription's batch may be cut
 * (SPEC 13), which the claim (store_claim.c) asks store_batch_order.c, and
 * the event order both use.
 */
#ifndef EVENTGRID_STORE_BATCH_ORDER_H
#define EVENTGRID_STORE_BATCH_ORDER_H

#include "postgres.h"

/* An event's place in its topic's event tables. */
typedef struct EgEventKey
{
	uint64		txid;
	int64		id;
} EgEventKey;

/* Event order, (txid, id): the order of a batch and of a chunk's key range. */
static inline int
cmp_event_key(uint64 txid_a, int64 id_a, uint64 txid_b, int64 id_b)
{
	if (txid_a != txid_b)
		return txid_a < txid_b ? -1 : 1;
	return id_a < id_b ? -1 : id_a > id_b ? 1 : 0;
}

/*
 * Of the next events of an ordered subscription's batch, in (txid, id)
 * order, rows[0..taken), how many may be taken now without an event of a
 * lower id left behind (SPEC 13: publish order within a batch is id
 * order); 0 when none.  The batch is that of a position (its topic, done
 * and upto snapshots as text, after_txid and after_id).
 */
extern int	eg_batch_safe_prefix(int64 sub, Datum topic, Datum done, const char *upto, Datum after_txid,
								 Datum after_id, const EgEventKey *rows, int taken);

#endif							/* EVENTGRID_STORE_BATCH_ORDER_H */
