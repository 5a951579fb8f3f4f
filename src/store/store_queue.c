/*
 * store_queue.c - what the workers do for queue event subscriptions (SPEC
 * 14, pull delivery) that no consumer's call does: a delivery worker's
 * claim makes the events newly visible to them receivable (references in
 * eventgrid.queue_batches: the events stay in the event tables), and the
 * upkeep worker expires events whose time to live ran out, or whose lock
 * expired on their last allowed delivery, while nobody received.
 */
#include "store/store.h"
#include "store/store_sql.h"

#include "catalog/pg_type_d.h"
#include "utils/timestamp.h"

static EgStatement expire_queue = {
	.name = "queue expiry",
	.sql = "SELECT eventgrid._queue_expire($1)",
	.nargs = 1,
	.types = {TIMESTAMPTZOID},
};

/*
 * Dead-letters (or drops) the receivable events of every queue
 * subscription that are past their time to live or were delivered
 * max_delivery_count times (eventgrid._queue_expire()); returns how many.
 * In a unit of work (the upkeep worker's).
 */
int64
eg_store_expire_queue(TimestampTz now)
{
	Datum		arg = TimestampTzGetDatum(now);

	eg_store_run(&expire_queue, &arg, SPI_OK_SELECT);
	return eg_int64_col(SPI_tuptable, 0, 1, 0);
}

/*
 * Queue subscriptions (SPEC 14) are not claimed at all: what becomes
 * visible to them is written as references into eventgrid.queue_batches,
 * where consumers receive it from (eventgrid._position_to_queue()).  This
 * finds, among the candidates $1 (store_claim_candidates.c), the positions
 * of this cluster, not held, that have events to pass, and locks those no other session holds; a
 * claim that finds nothing new holds nothing.  Returns the ids locked
 * (none: one row, NULL) and the ids another session holds.  Always the
 * generic plan: planning it (with _unpassed_events() inlined over the
 * event tables) took longer than running it.
 */
static EgStatement transferred_positions = {
	.name = "transferred positions",
	.sql =
	"WITH cand AS MATERIALIZED ("
	"  SELECT p.subscription_id FROM eventgrid.subscription_positions p"
	"    JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id"
	"   WHERE p.subscription_id = ANY ($1) AND s.delivery_mode = 'queue'"
	"     AND p.system_identifier = eventgrid._system_identifier() AND NOT " EG_SQL_HELD("s")
	"     AND EXISTS (SELECT 1 FROM eventgrid._unpassed_events(s.read_key, p.done, p.upto, p.after_txid, p.after_id) e"
	"                  WHERE pg_visible_in_snapshot(e.txid, pg_current_snapshot()))"
	"), locked AS MATERIALIZED ("
	"  SELECT p.subscription_id FROM eventgrid.subscription_positions p"
	"   WHERE p.subscription_id IN (SELECT c.subscription_id FROM cand c)"
	"   ORDER BY p.subscription_id FOR UPDATE OF p SKIP LOCKED"
	")"
	"SELECT l.subscription_id,"
	"       ARRAY(SELECT c.subscription_id FROM cand c"
	"              WHERE c.subscription_id NOT IN (SELECT k.subscription_id FROM locked k))"
	"  FROM (SELECT 1) x LEFT JOIN locked l ON true ORDER BY l.subscription_id",
	.nargs = 1,
	.types = {INT8ARRAYOID},
	.generic = true,
};

static EgStatement transfer = {
	.name = "position transfer",
	.sql = "SELECT eventgrid._position_to_queue($1, $2)",
	.nargs = 2,
	.types = {INT8OID, TIMESTAMPTZOID},
};

/*
 * Makes the events newly visible to the queue subscriptions among the
 * candidates cand receivable at now, 100 references a row in
 * eventgrid.queue_batches, no copy of any event (consumers waiting in
 * receive() are woken at commit); returns how many, and sets *locked when
 * another session held such a subscription's position that had events to
 * pass (kept for the next claim: eg_store_claim_keep()).  In the claim's
 * unit of work, before the retries are claimed.
 */
int64
eg_store_transfer_positions(TimestampTz now, const EgClaimCandidates *cand, bool *locked)
{
	int			n;
	int64	   *sids;
	int64		moved = 0;
	Datum		arg;
	int64	   *held;
	int			nheld;

	*locked = false;
	if (cand->nqueue == 0)
		return 0;
	arg = eg_int8_array(cand->queue, cand->nqueue);
	eg_store_run(&transferred_positions, &arg, SPI_OK_SELECT);
	n = (int) SPI_processed;
	held = eg_int8_array_col(SPI_tuptable, 0, 2, &nheld);
	for (int i = 0; i < nheld; i++)
		eg_store_claim_keep(held[i], true);
	*locked = nheld > 0;
	sids = palloc(n * sizeof(int64));
	for (int i = 0; i < n; i++)
		sids[i] = eg_int64_col(SPI_tuptable, i, 1, 0);
	for (int i = 0; i < n; i++)
	{
		Datum		args[2] = {Int64GetDatum(sids[i]), TimestampTzGetDatum(now)};

		if (sids[i] == 0)
			continue;			/* none locked */
		eg_store_run(&transfer, args, SPI_OK_SELECT);
		moved += eg_int64_col(SPI_tuptable, 0, 1, 0);
	}
	pfree(sids);
	return moved;
}
