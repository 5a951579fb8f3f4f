/*
 * store_claim.c - claiming first attempts (SPEC sections 1, 2, 5, 9 and
 * 20) from the positions of the claim's candidates
 * (store_claim_candidates.c), in three steps: scan which events come next,
 * move the positions past what is taken and write the chunks (here), then
 * load what the chunks deliver (store_claim_load.c); due retries are
 * claimed in store_claim_retries.c, and both return the request columns of
 * store_claim.h.  The claim's transaction commits before any network I/O;
 * delivery_claim.c turns the rows into requests.
 */
#include "store/store_claim.h"
#include "core/rate.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/*
 * First attempts, step one: what to take.  For each candidate position $4
 * (store_claim_candidates.c: those whose read key has new events, and those
 * the worker kept), locked (one worker at a time), not in $2, the next
 * events of its batch in (txid, id) order: those of transactions that were
 * in progress at "done", and those that began after it, both visible in
 * "upto" (a new snapshot when no batch is open).  At most $1 per
 * subscription, each with whether the subscription's filters take it and
 * its size; a position with nothing left in its batch gives one row with
 * no event.  Rows are narrow and unordered: scan_positions() orders them,
 * cut_positions() cuts them at the byte budget and moves the positions
 * (advance), eg_claim_load_chunks() (store_claim_load.c) then reads what is
 * to be sent.  done and upto come as text, once per position.  The row
 * comparison after the position's last event is raised to the scalar bound
 * beside it: the B-tree scan starts at the row comparison, and one of (0,
 * 0) (no last event) read the topic's entries from the table's start.
 */
/*
 * The rest of a position's batch, read in (txid, id) order: events of the
 * transactions in progress at "done" that "upto" sees (DONE_XIP), and of
 * those that began after "done" (AFTER_XMAX); the claim scan reads each
 * from a topic's events or, for a domain topic's subscription, from its
 * domain topic's.
 */
#define EG_SQL_SCAN_DONE_XIP \
	"AND e.txid >= pg_snapshot_xmin(pos.done) AND e.txid < pg_snapshot_xmax(pos.done)" \
	" AND (e.txid, e.id) > (pos.after_txid, pos.after_id)" \
	" AND pg_visible_in_snapshot(e.txid, pos.upto)"
#define EG_SQL_SCAN_AFTER_XMAX \
	"AND (e.txid, e.id) > (greatest(pos.after_txid, pg_snapshot_xmax(pos.done))," \
	"                      CASE WHEN pos.after_txid >= pg_snapshot_xmax(pos.done)" \
	"                           THEN pos.after_id ELSE 0 END)" \
	" AND e.txid >= pg_snapshot_xmax(pos.done) AND e.txid < pg_snapshot_xmax(pos.upto)" \
	" AND pg_visible_in_snapshot(e.txid, pos.upto)"

static EgStatement claim_scan = {
	.name = "first-attempt claim",
	.sql =
	"WITH snap AS MATERIALIZED ("
	"  SELECT pg_current_snapshot() AS s, eventgrid._system_identifier() AS sysid"
	"), pos AS MATERIALIZED ("
	"  SELECT p.subscription_id, p.done, coalesce(p.upto, snap.s) AS upto,"
	"         p.done::text AS done_text, coalesce(p.upto, snap.s)::text AS upto_text,"
	"         coalesce(p.after_txid, '0'::xid8) AS after_txid, coalesce(p.after_id, 0) AS after_id,"
	"         ARRAY(SELECT pg_snapshot_xip(p.done)) AS done_xip, p.upto IS NULL AS fresh,"
	"         coalesce(p.served_at, '-infinity') AS turn, p.lease_owner IS NOT NULL AS leased"
	"    FROM eventgrid.subscription_positions p CROSS JOIN snap"
	"   WHERE p.subscription_id = ANY ($4) AND p.subscription_id <> ALL ($2)"
	"     AND p.system_identifier = snap.sysid"
	"     AND NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions hs"
	"                      WHERE hs.id = p.subscription_id AND " EG_SQL_HELD("hs") ")"
	/* an ordered subscription's, while another worker holds first attempts of it (tested on p itself: EvalPlanQual sees a lease taken since the snapshot) */
	"     AND (p.lease_owner IS NULL OR p.lease_owner = $3)"
	/* in turn, at most $5 (those left are kept for the next claim) */
	"   ORDER BY coalesce(p.served_at, '-infinity'), p.subscription_id"
	"   LIMIT $5"
	"   FOR UPDATE OF p SKIP LOCKED"
	")"
	" SELECT pos.subscription_id, pos.turn, e.txid, e.id,"
	"        e.id IS NOT NULL AND eventgrid._matches(e.event, s.included_event_types_lower,"
	"            s.subject_begins_with, s.subject_ends_with, s.is_subject_case_sensitive,"
	"            s.advanced_filters, s.enable_advanced_filtering_on_arrays) AS matched,"
	"        coalesce(e.event_bytes, 0), pos.done_text, pos.upto_text, s.read_key, pos.fresh,"
	"        pos.after_txid, pos.after_id, s.max_events_per_second, s.ordering_key IS NOT NULL, pos.leased"
	"   FROM pos JOIN eventgrid.event_subscriptions s ON s.id = pos.subscription_id"
	"   LEFT JOIN LATERAL ("
	"     SELECT u.* FROM ("
	"       (SELECT e.txid, e.id, e.event, e.event_bytes FROM eventgrid.events e"
	"         WHERE cardinality(pos.done_xip) > 0 AND s.domain_topic IS NULL"
	"           AND e.topic = s.topic AND e.txid = ANY (pos.done_xip)"
	"           " EG_SQL_SCAN_DONE_XIP
	"         ORDER BY e.txid, e.id LIMIT $1)"
	"       UNION ALL"
	"       (SELECT e.txid, e.id, e.event, e.event_bytes FROM eventgrid.events e"
	"         WHERE s.domain_topic IS NULL AND e.topic = s.topic"
	"           " EG_SQL_SCAN_AFTER_XMAX
	"         ORDER BY e.txid, e.id LIMIT $1)"
	/* a domain topic's subscription (SPEC 18): its events only, through events_read_key_idx */
	"       UNION ALL"
	"       (SELECT e.txid, e.id, e.event, e.event_bytes FROM eventgrid.events e"
	"         WHERE cardinality(pos.done_xip) > 0 AND s.domain_topic IS NOT NULL"
	"           AND e.domain_topic IS NOT NULL AND " EG_SQL_EVENT_READ_KEY " = s.read_key"
	"           AND e.txid = ANY (pos.done_xip)"
	"           " EG_SQL_SCAN_DONE_XIP
	"         ORDER BY e.txid, e.id LIMIT $1)"
	"       UNION ALL"
	"       (SELECT e.txid, e.id, e.event, e.event_bytes FROM eventgrid.events e"
	"         WHERE s.domain_topic IS NOT NULL"
	"           AND e.domain_topic IS NOT NULL AND " EG_SQL_EVENT_READ_KEY " = s.read_key"
	"           " EG_SQL_SCAN_AFTER_XMAX
	"         ORDER BY e.txid, e.id LIMIT $1)"
	"     ) u ORDER BY u.txid, u.id LIMIT $1"
	"   ) e ON true",
	.nargs = 5,
	.types = {INT4OID, INT8ARRAYOID, INT4OID, INT8ARRAYOID, INT4OID},
};
enum
{
	CS_SUBSCRIPTION_ID = 1,
	CS_TURN,
	CS_TXID,
	CS_EVENT_ID,
	CS_MATCHED,
	CS_BYTES,
	CS_DONE,
	CS_UPTO,
	CS_TOPIC,
	CS_FRESH,
	CS_AFTER_TXID,
	CS_AFTER_ID,
	CS_RATE,
	CS_ORDERED,				/* an ordered subscription's (SPEC 13) */
	CS_LEASED				/* its first attempts are in flight (this worker's: others are not scanned) */
};

/*
 * An ordered subscription's batch that claims cannot take in (txid, id)
 * order moves into its retries, in id order (ordered_prefix()); the caller
 * holds the position's lock.
 */
static EgStatement ordered_transfer = {
	.name = "ordered batch transfer",
	.sql = "SELECT eventgrid._position_to_retries($1, $2, true)",
	.nargs = 2,
	.types = {INT8OID, TIMESTAMPTZOID},
};

/*
 * Moves positions past what a claim took, and writes its chunks.  Per
 * subscription: complete (the batch is done: "done" becomes "upto"), or
 * the batch "upto" with the last event taken; and a chunk when events were
 * taken for delivery.
 */
static EgStatement advance = {
	.name = "position advance",
	.sql =
	"WITH a AS ("
	"  SELECT * FROM unnest($1::int8[], $2::bool[], $3::text[], $4::xid8[], $5::int8[], $6::int8[],"
	"                       $7::text[], $8::text[], $11::xid8[], $12::int8[])"
	"         AS a(subscription_id, complete, upto, last_txid, last_id, chunk, topic, done,"
	"              old_after_txid, old_after_id)"
	"), moved AS ("
	"  UPDATE eventgrid.subscription_positions p"
	"     SET done = CASE WHEN a.complete THEN a.upto::pg_snapshot ELSE p.done END,"
	"         upto = CASE WHEN a.complete THEN NULL ELSE a.upto::pg_snapshot END,"
	"         after_txid = CASE WHEN a.complete THEN NULL ELSE a.last_txid END,"
	"         after_id = CASE WHEN a.complete THEN NULL ELSE a.last_id END,"
	"         served_at = $9,"
	/* an ordered subscription's first attempts are this worker's until recorded (store_record.c: record_first lets go) */
	"         lease_owner = CASE WHEN a.chunk IS NOT NULL AND s.ordering_key IS NOT NULL THEN $10"
	"                            ELSE p.lease_owner END"
	"    FROM a CROSS JOIN LATERAL (SELECT s.ordering_key FROM eventgrid.event_subscriptions s"
	"                                WHERE s.id = a.subscription_id OFFSET 0) s"
	"   WHERE p.subscription_id = a.subscription_id"
	"  RETURNING p.subscription_id"
	")"
	"INSERT INTO eventgrid.chunks_in_flight (lease_owner, chunk, subscription_id, topic, done, upto,"
	"       after_txid, after_id, last_txid, last_id)"
	"SELECT $10, a.chunk, a.subscription_id, a.topic, a.done::pg_snapshot, a.upto::pg_snapshot,"
	"       nullif(a.old_after_txid, '0'::xid8), nullif(a.old_after_id, 0), a.last_txid, a.last_id"
	"  FROM a WHERE a.chunk IS NOT NULL",
	.nargs = 12,
	.types = {INT8ARRAYOID, BOOLARRAYOID, TEXTARRAYOID, XID8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID,
		TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID, INT4OID, XID8ARRAYOID, INT8ARRAYOID},
	.generic = true,
};


/* A scanned row of a first-attempt claim, with the keys it is ordered by. */
typedef struct EgScanRow
{
	TimestampTz turn;
	int64		subscription_id;
	uint64		txid;			/* 0: no event (the position's batch is empty) */
	int64		id;
	int64		bytes;
	bool		matched;
	int			rate;			/* max_events_per_second, 0: none */
	HeapTuple	tuple;
} EgScanRow;

static int
cmp_scan_rows(const void *a, const void *b)
{
	const EgScanRow *x = a;
	const EgScanRow *y = b;

	if (x->turn != y->turn)
		return x->turn < y->turn ? -1 : 1;
	if (x->subscription_id != y->subscription_id)
		return x->subscription_id < y->subscription_id ? -1 : 1;
	return cmp_event_key(x->txid, x->id, y->txid, y->id);
}

/*
 * Step one: runs claim_scan and returns its rows (*n of them) grouped by
 * subscription in turn order (never served first), events in (txid, id)
 * order.
 */
static EgScanRow *
scan_positions(const EgClaimSize *size, const int64 *skip, int nskip, int lease_owner,
			   const EgClaimCandidates *cand, int *n)
{
	Datum		args[5];
	SPITupleTable *tt;
	EgScanRow  *scan;

	args[0] = Int32GetDatum(size->rows_per_position);
	args[1] = eg_int8_array(skip, nskip);
	args[2] = Int32GetDatum(lease_owner);
	args[3] = eg_int8_array(cand->push, cand->npush);
	args[4] = Int32GetDatum(Max(size->positions, 1));
	eg_store_run(&claim_scan, args, SPI_OK_SELECT);
	*n = (int) SPI_processed;
	tt = SPI_tuptable;
	scan = palloc(Max(*n, 1) * sizeof(EgScanRow));
	for (int i = 0; i < *n; i++)
	{
		bool		isnull;
		Datum		v = SPI_getbinval(tt->vals[i], tt->tupdesc, CS_TXID, &isnull);

		scan[i].tuple = tt->vals[i];
		scan[i].subscription_id = eg_int64_col(tt, i, CS_SUBSCRIPTION_ID, 0);
		scan[i].turn = eg_timestamp_col(tt, i, CS_TURN);
		scan[i].txid = isnull ? 0 : DatumGetUInt64(v);
		scan[i].id = eg_int64_col(tt, i, CS_EVENT_ID, 0);
		scan[i].matched = eg_bool_col(tt, i, CS_MATCHED);
		scan[i].bytes = eg_int32_col(tt, i, CS_BYTES, 0) + EG_DELIVERY_OVERHEAD_BYTES;
		scan[i].rate = eg_int32_col(tt, i, CS_RATE, 0);
	}
	qsort(scan, *n, sizeof(EgScanRow), cmp_scan_rows);
	return scan;
}

/* The arrays the advance statement takes, one entry per position moved. */
typedef struct EgAdvance
{
	int			n;
	Datum	   *sub_ids,
			   *complete,
			   *uptos,
			   *chunks,
			   *topics,
			   *dones,
			   *last_ids,
			   *old_after_ids;
	bool	   *chunk_nulls;
	uint64	   *last_txids,
			   *old_after_txids;
	int64	   *transfer;		/* ordered subscriptions whose batch moves into the retries */
	int			ntransfer;
	bool		lease_wait;		/* such a batch waits for this worker's own first attempts in flight */
} EgAdvance;

static void
advance_init(EgAdvance *a, int cap)
{
	cap = Max(cap, 1);
	a->n = 0;
	a->sub_ids = palloc(cap * sizeof(Datum));
	a->complete = palloc(cap * sizeof(Datum));
	a->uptos = palloc(cap * sizeof(Datum));
	a->chunks = palloc(cap * sizeof(Datum));
	a->topics = palloc(cap * sizeof(Datum));
	a->dones = palloc(cap * sizeof(Datum));
	a->last_ids = palloc(cap * sizeof(Datum));
	a->old_after_ids = palloc(cap * sizeof(Datum));
	a->chunk_nulls = palloc(cap * sizeof(bool));
	a->last_txids = palloc(cap * sizeof(uint64));
	a->old_after_txids = palloc(cap * sizeof(uint64));
	a->transfer = palloc(cap * sizeof(int64));
	a->ntransfer = 0;
	a->lease_wait = false;
}

/*
 * How many of the first taken rows of scan, an ordered subscription's
 * position's batch that this claim cannot take whole (scan row first), may
 * be taken now: the longest prefix that ends where every event taken has a
 * lower id than every event left (eg_batch_safe_prefix()); 0 when none.
 */
static int
ordered_prefix(int64 sub, const EgScanRow *scan, int taken, HeapTuple first, TupleDesc desc)
{
	bool		isnull;
	EgEventKey *keys = palloc(Max(taken, 1) * sizeof(EgEventKey));
	int			safe;

	for (int m = 0; m < taken; m++)
	{
		keys[m].txid = scan[m].txid;
		keys[m].id = scan[m].id;
	}
	safe = eg_batch_safe_prefix(sub, SPI_getbinval(first, desc, CS_TOPIC, &isnull),
								SPI_getbinval(first, desc, CS_DONE, &isnull),
								TextDatumGetCString(SPI_getbinval(first, desc, CS_UPTO, &isnull)),
								SPI_getbinval(first, desc, CS_AFTER_TXID, &isnull),
								SPI_getbinval(first, desc, CS_AFTER_ID, &isnull), keys, taken);
	pfree(keys);
	return safe;
}

/*
 * Step two: takes, from the scanned rows of each position in turn, events
 * while the bytes to deliver before them in this claim stay under budget
 * (at least 1: the first event always) and, for a rate-limited
 * subscription, while it has tokens (rate.c; the events after stay at the
 * position), and fills *a with how the positions move and which chunks
 * (numbered from *next_chunk) are written; written[] gets the chunk
 * numbers.  Returns the number of chunks, *more whether a position has
 * more to give at once (not one that waits for its rate), size->busy how
 * many positions had events and size->scanned how many events they gave.
 */
static int
cut_positions(EgScanRow *scan, int n, SPITupleTable *tt, EgClaimSize *size, int64 budget, TimestampTz now,
			  int64 *next_chunk, EgAdvance *a, Datum *written, bool *more)
{
	int64		before = 0;
	int			nchunks = 0;

	for (int i = 0; i < n;)
	{
		int64		sub = scan[i].subscription_id;
		HeapTuple	first = scan[i].tuple;
		int			j = i;
		int			scanned = 0;
		int			taken = 0;
		bool		delivered = false;
		bool		complete;
		bool		isnull;
		int			k = a->n;

		int			granted = INT_MAX;
		int			sent = 0;
		bool		rate_cut = false;

		while (j < n && scan[j].subscription_id == sub)
			j++;
		if (scan[i].txid != 0)
		{
			scanned = j - i;
			size->busy++;
			size->scanned += scanned;
		}
		if (scan[i].rate > 0 && scanned > 0)
		{
			int			want = 0;

			for (int m = i; m < i + scanned; m++)
				want += scan[m].matched;
			granted = eg_rate_take(sub, scan[i].rate, want, now);
		}
		while (taken < scanned && before < budget)
		{
			if (scan[i + taken].matched)
			{
				if (sent == granted)
				{
					rate_cut = true;
					break;
				}
				sent++;
				before += scan[i + taken].bytes;
			}
			taken++;
		}
		if (granted != INT_MAX)
			eg_rate_give_back(sub, scan[i].rate, granted - sent);

		/*
		 * Nothing in the batch: it is complete (nothing to write for an idle
		 * position with no batch open).  All it had was taken: the batch is
		 * complete unless the limit stopped the scan.  Cut by the byte
		 * budget: the position stops at the last event taken, or does not
		 * move when the cut came before its first event.
		 */
		if ((scanned == 0 && DatumGetBool(SPI_getbinval(first, tt->tupdesc, CS_FRESH, &isnull))) ||
			(scanned > 0 && taken == 0))
		{
			*more = *more || (scanned > 0 && !rate_cut);
			if (scanned > 0)
				eg_store_claim_keep(sub, false);	/* its events wait for the budget or the rate */
			i = j;
			continue;
		}
		complete = taken == scanned && scanned < size->rows_per_position;

		/*
		 * An ordered subscription's batch that this claim cannot take whole
		 * is taken a claim at a time only when (txid, id) order is its
		 * publish order; otherwise it moves into the retries in id order
		 * (eventgrid._position_to_retries(), transfer) once nothing of the
		 * subscription is in flight.
		 */
		if (!complete && DatumGetBool(SPI_getbinval(first, tt->tupdesc, CS_ORDERED, &isnull)))
		{
			int			safe = ordered_prefix(sub, &scan[i], taken, first, tt->tupdesc);
			int			unsent = 0;

			for (int m = i + safe; m < i + taken; m++)
				unsent += scan[m].matched;
			if (granted != INT_MAX)
				eg_rate_give_back(sub, scan[i].rate, unsent);
			sent -= unsent;
			taken = safe;
			if (taken == 0)
			{
				eg_store_claim_keep(sub, false);
				if (!DatumGetBool(SPI_getbinval(first, tt->tupdesc, CS_LEASED, &isnull)))
					a->transfer[a->ntransfer++] = sub;
				else
					a->lease_wait = true;	/* moved once they are recorded: look again soon */
				i = j;
				continue;
			}
		}

		/*
		 * More at once: a batch not complete (unless its rate holds it),
		 * or one completed that an earlier claim opened: transactions that
		 * committed since its snapshot, whose wake-ups may have been
		 * taken by the claims between, are in the next batch.
		 */
		*more = *more || (!complete && !rate_cut) ||
			(complete && !DatumGetBool(SPI_getbinval(first, tt->tupdesc, CS_FRESH, &isnull)));

		/*
		 * Settled only when done becomes this claim's snapshot: a batch left
		 * open, or an old one completed, is looked at again by this worker.
		 */
		if (!complete || !DatumGetBool(SPI_getbinval(first, tt->tupdesc, CS_FRESH, &isnull)))
			eg_store_claim_keep(sub, false);
		a->sub_ids[k] = Int64GetDatum(sub);
		a->complete[k] = BoolGetDatum(complete);
		a->dones[k] = PointerGetDatum(DatumGetTextPP(SPI_getbinval(first, tt->tupdesc, CS_DONE, &isnull)));
		a->uptos[k] = PointerGetDatum(DatumGetTextPP(SPI_getbinval(first, tt->tupdesc, CS_UPTO, &isnull)));
		a->topics[k] = PointerGetDatum(DatumGetTextPP(SPI_getbinval(first, tt->tupdesc, CS_TOPIC, &isnull)));
		a->old_after_txids[k] = DatumGetUInt64(SPI_getbinval(first, tt->tupdesc, CS_AFTER_TXID, &isnull));
		a->old_after_ids[k] = SPI_getbinval(first, tt->tupdesc, CS_AFTER_ID, &isnull);
		a->last_txids[k] = 0;
		a->last_ids[k] = Int64GetDatum(0);
		for (int m = i; m < i + taken; m++)
		{
			a->last_txids[k] = scan[m].txid;
			a->last_ids[k] = Int64GetDatum(scan[m].id);
			delivered = delivered || scan[m].matched;
		}
		a->chunk_nulls[k] = !delivered;
		a->chunks[k] = Int64GetDatum(delivered ? (*next_chunk)++ : 0);
		if (delivered)
			written[nchunks++] = a->chunks[k];
		a->n++;
		i = j;
	}
	return nchunks;
}

/* Runs the advance statement with the arrays of a. */
static void
run_advance(const EgAdvance *a, TimestampTz now, int lease_owner)
{
	Datum		args[12];
	int			n = a->n;

	args[0] = eg_make_array(a->sub_ids, NULL, n, INT8OID);
	args[1] = eg_make_array(a->complete, NULL, n, BOOLOID);
	args[2] = eg_make_array(a->uptos, NULL, n, TEXTOID);
	args[3] = eg_xid8_array(a->last_txids, n);
	args[4] = eg_make_array(a->last_ids, NULL, n, INT8OID);
	args[5] = eg_make_array(a->chunks, a->chunk_nulls, n, INT8OID);
	args[6] = eg_make_array(a->topics, NULL, n, TEXTOID);
	args[7] = eg_make_array(a->dones, NULL, n, TEXTOID);
	args[8] = TimestampTzGetDatum(now);
	args[9] = Int32GetDatum(lease_owner);
	args[10] = eg_xid8_array(a->old_after_txids, n);
	args[11] = eg_make_array(a->old_after_ids, NULL, n, INT8OID);
	eg_store_run(&advance, args, SPI_OK_INSERT);
}

/* The ids of the positions the scan gave (scan is grouped by subscription), sorted. */
static int64 *
scanned_ids(const EgScanRow *scan, int n, int *nids)
{
	int64	   *ids = palloc(Max(n, 1) * sizeof(int64));

	*nids = 0;
	for (int i = 0; i < n; i++)
		if (i == 0 || scan[i].subscription_id != scan[i - 1].subscription_id)
			ids[(*nids)++] = scan[i].subscription_id;
	qsort(ids, *nids, sizeof(int64), eg_cmp_int64);
	return ids;
}

/*
 * Of the candidates $1 the scan did not give, those still to be claimed
 * from (of this cluster, not held, not another worker's lease): another
 * session held their positions.  The others (dropped, paused since) are
 * let go.
 */
static EgStatement still_wanted = {
	.name = "claim candidates held elsewhere",
	.sql =
	"SELECT coalesce(array_agg(p.subscription_id), '{}')"
	"  FROM eventgrid.subscription_positions p JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id"
	" WHERE p.subscription_id = ANY ($1) AND p.system_identifier = eventgrid._system_identifier()"
	"   AND (p.lease_owner IS NULL OR p.lease_owner = $2) AND NOT " EG_SQL_HELD("s"),
	.nargs = 2,
	.types = {INT8ARRAYOID, INT4OID},
	.generic = true,
};

/*
 * The candidates the scan did not give are kept for the next claim: those
 * whose endpoint is backed up (in skip), and those another session holds;
 * returns whether another session held one.  When the scan gave as many
 * positions as it may (positions: *cut), every one it did not give is kept,
 * to be looked at in its turn (one dropped or paused since is let go then).
 */
static bool
keep_unscanned(const EgClaimCandidates *cand, const EgScanRow *scan, int n, const int64 *skip, int nskip,
			   int lease_owner, int positions, bool *cut)
{
	int			nids;
	int64	   *ids = scanned_ids(scan, n, &nids);
	int64	   *missing = palloc(Max(cand->npush, 1) * sizeof(int64));
	int			nmissing = 0;
	Datum		args[2];
	int64	   *held;
	int			nheld;

	*cut = nids >= positions;
	for (int i = 0, j = 0; i < cand->npush; i++)
	{
		int64		sub = cand->push[i];
		bool		skipped = false;

		while (j < nids && ids[j] < sub)
			j++;
		if (j < nids && ids[j] == sub)
			continue;
		for (int k = 0; k < nskip && !skipped; k++)
			skipped = skip[k] == sub;
		if (skipped || *cut)
			eg_store_claim_keep(sub, false);
		else
			missing[nmissing++] = sub;
	}
	pfree(ids);
	if (nmissing == 0)
		return false;
	args[0] = eg_int8_array(missing, nmissing);
	args[1] = Int32GetDatum(lease_owner);
	eg_store_run(&still_wanted, args, SPI_OK_SELECT);
	held = eg_int8_array_col(SPI_tuptable, 0, 1, &nheld);
	for (int i = 0; i < nheld; i++)
		eg_store_claim_keep(held[i], false);
	return nheld > 0;
}

/*
 * Claims first attempts: for the candidate positions (cand->push) that no
 * other session holds, at most size->positions of them in turn (by when
 * they were last served, never served first), the next events of its
 * snapshot batch, at most size->rows_per_position per subscription, cut
 * where the events to deliver reach byte_budget bytes (at least one
 * event).  Events the subscription's filters leave out
 * are passed over.  Positions move past what was taken, and what is to be
 * delivered is written as chunks in flight numbered from *next_chunk (one
 * per subscription), in this unit of work; the deliveries are then read
 * from those chunks.  Returns the deliveries, ordered by chunk and then
 * (txid, id); *more says whether a position has more to give at once,
 * *locked that another session holds a candidate's position.  The nskip
 * event subscriptions in skip are left out (their endpoint is backed up).
 * Positions not settled (eg_store_claim_keep()) are looked at again by the
 * next claim.  size->busy and size->scanned: how many positions had events
 * and how many they gave.  *rows stay valid until
 * eg_store_commit().
 */
int
eg_store_claim_first(TimestampTz now, EgClaimSize *size, int64 byte_budget, int lease_owner,
					 const EgClaimCandidates *cand, const int64 *skip, int nskip,
					 int64 *next_chunk, EgClaimedRow **rows, bool *more, bool *locked)
{
	int			n;
	int			nchunks;
	EgScanRow  *scan;
	SPITupleTable *tt;
	EgAdvance	a;
	Datum	   *written;
	bool		cut;

	*more = false;
	*locked = false;
	size->busy = 0;
	size->scanned = 0;
	*rows = palloc0(sizeof(EgClaimedRow));	/* none yet: never a NULL for memcpy */
	if (cand->npush == 0)
		return 0;
	scan = scan_positions(size, skip, nskip, lease_owner, cand, &n);
	tt = SPI_tuptable;
	*locked = keep_unscanned(cand, scan, n, skip, nskip, lease_owner, Max(size->positions, 1), &cut);
	advance_init(&a, n);
	written = palloc(Max(n, 1) * sizeof(Datum));
	nchunks = cut_positions(scan, n, tt, size, Max(byte_budget, 1), now, next_chunk, &a, written, more);
	/* the positions left for their turn are looked at at once */
	*more = *more || (cut && cand->npush > size->positions);
	if (a.n > 0)
		run_advance(&a, now, lease_owner);
	for (int i = 0; i < a.ntransfer; i++)
	{
		Datum		args[2] = {Int64GetDatum(a.transfer[i]), TimestampTzGetDatum(now)};

		eg_store_run(&ordered_transfer, args, SPI_OK_SELECT);
		*more = true;			/* its retries are due at once */
	}

	/*
	 * An ordered batch that waits for this worker's own first attempts of
	 * it to be recorded (nothing else would bring the worker back to it:
	 * found stalled in test 071): the worker looks again a little later.
	 */
	*locked = *locked || a.lease_wait;
	if (nchunks == 0)
		return 0;
	*rows = eg_claim_load_chunks(written, nchunks, now, lease_owner, &n);
	return n;
}
