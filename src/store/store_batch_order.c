/*
 * store_batch_order.c - where an ordered subscription's batch may be cut
 * (SPEC 13).  A batch is what became visible to a position between two
 * snapshots; within it publish order is id order (among transactions that
 * overlapped, a higher txid may have published first: one that waited for
 * a row lock the other held, say).  The claim reads a position in (txid,
 * id) order, a claim's worth at a time, and sorts what it takes by id
 * (delivery_claim.c); so a claim may stop only where every event it takes
 * has a lower id than every event it leaves: a clean cut.
 *
 * One narrow pass over the rest of the batch (txid and id, which the
 * index holds) finds its clean cuts, once per batch: for each event the
 * highest id up to it and the lowest after it.  Transactions run one after
 * the other cut everywhere (the batch is in order: nothing is kept); short
 * overlapping transactions cut often; a batch that cannot be cut within a
 * claim moves into the retries in id order instead (store_claim.c).
 */
#include "store/store.h"
#include "store/store_batch_order.h"
#include "store/store_sql.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

/*
 * The clean cuts of the rest of the batch of position (topic $1, done $2,
 * upto $3, after ($4, $5)): the events after which it may be cut, in
 * (txid, id) order, each with how many events the rest holds.
 */
static EgStatement batch_cuts = {
	.name = "batch cut points",
	.sql =
	"SELECT x.txid, x.id, x.n FROM ("
	"  SELECT e.txid, e.id, count(*) OVER () AS n,"
	"         max(e.id) OVER (ORDER BY e.txid, e.id ROWS UNBOUNDED PRECEDING) AS upto_max,"
	"         min(e.id) OVER (ORDER BY e.txid DESC, e.id DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)"
	"           AS after_min"
	"    FROM eventgrid._unpassed_events($1, $2::pg_snapshot, $3::pg_snapshot, $4, $5) e"
	"   WHERE pg_visible_in_snapshot(e.txid, $3::pg_snapshot)"
	") x WHERE x.after_min IS NULL OR x.upto_max < x.after_min"
	" ORDER BY x.txid, x.id",
	.nargs = 5,
	.types = {TEXTOID, TEXTOID, TEXTOID, XID8OID, INT8OID},
};

#define EG_BATCH_CACHE 64			/* batches remembered */
#define EG_BATCH_MAX_CUTS 1000000	/* cut points kept of one batch (16 MB); past it, not cut */

/* the cut points of a batch (subscription, upto snapshot) */
typedef struct BatchCuts
{
	int64		subscription_id;
	char	   *upto;
	bool		everywhere;		/* in order: every event is a cut point */
	int			ncuts;
	EgEventKey *cuts;			/* else these, in (txid, id) order */
} BatchCuts;

static BatchCuts cache[EG_BATCH_CACHE];
static int	ncache = 0;
static int	next_slot = 0;

static bool
is_cut(const BatchCuts *b, const EgEventKey *k)
{
	int			lo = 0;
	int			hi = b->ncuts - 1;

	if (b->everywhere)
		return true;
	while (lo <= hi)
	{
		int			mid = (lo + hi) / 2;
		int			c = cmp_event_key(b->cuts[mid].txid, b->cuts[mid].id, k->txid, k->id);

		if (c == 0)
			return true;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return false;
}

/* The cut points of a batch, found once (batch_cuts) and remembered. */
static const BatchCuts *
cuts_of(int64 sub, Datum topic, Datum done, const char *upto, Datum after_txid, Datum after_id)
{
	Datum		args[5] = {topic, done, CStringGetTextDatum(upto), after_txid, after_id};
	SPITupleTable *saved = SPI_tuptable;
	BatchCuts  *b;
	int			n;

	for (int i = 0; i < ncache; i++)
		if (cache[i].subscription_id == sub && strcmp(cache[i].upto, upto) == 0)
			return &cache[i];
	/*
	 * A new snapshot: upto may be the claim scan's own, newer than the one
	 * the claim's unit of work began with, which can miss transactions of
	 * the batch that committed in between (and find a clean cut that is
	 * not one: a key's later event taken before its earlier, seen in test
	 * 054 once in about forty runs).
	 */
	eg_store_run(&batch_cuts, args, SPI_OK_SELECT);
	n = (int) SPI_processed;

	b = &cache[next_slot];
	if (ncache == EG_BATCH_CACHE)
	{
		pfree(b->upto);
		if (b->cuts)
			pfree(b->cuts);
	}
	else
		ncache++;
	next_slot = (next_slot + 1) % EG_BATCH_CACHE;
	b->subscription_id = sub;
	b->upto = MemoryContextStrdup(TopMemoryContext, upto);
	b->everywhere = n > 0 && eg_int64_col(SPI_tuptable, 0, 3, 0) == n;
	b->ncuts = 0;
	b->cuts = NULL;
	if (!b->everywhere && n > 0 && n <= EG_BATCH_MAX_CUTS)
	{
		b->cuts = MemoryContextAlloc(TopMemoryContext, n * sizeof(EgEventKey));
		for (int i = 0; i < n; i++)
		{
			b->cuts[i].txid = (uint64) eg_int64_col(SPI_tuptable, i, 1, 0);
			b->cuts[i].id = eg_int64_col(SPI_tuptable, i, 2, 0);
		}
		b->ncuts = n;
	}
	SPI_freetuptable(SPI_tuptable);
	SPI_tuptable = saved;		/* the claim's scan rows stay the caller's */
	return b;
}

int
eg_batch_safe_prefix(int64 sub, Datum topic, Datum done, const char *upto, Datum after_txid, Datum after_id,
					 const EgEventKey *rows, int taken)
{
	const BatchCuts *b = cuts_of(sub, topic, done, upto, after_txid, after_id);

	for (int t = taken; t > 0; t--)
		if (is_cut(b, &rows[t - 1]))
			return t;
	return 0;
}
