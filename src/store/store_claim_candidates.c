/*
 * store_claim_candidates.c - which event subscriptions' positions a
 * delivery worker's claim looks at (SPEC 20): those whose read key (a
 * topic, or a domain topic) has events past the claim before, plus the
 * ones the worker kept, not every position of the database.  A claim's
 * cost so follows what has something to send, not how many event
 * subscriptions exist.
 *
 * The rule.  Each discovery takes a snapshot S; the next one looks at the
 * read keys with events that S did not see (transaction ids at or past its
 * xmax, or in progress in it: probes of events_batch_idx, and for a domain
 * its new events' domain topics).  An event that S saw was there at that
 * discovery: either its key was found then, or at one before (induction),
 * and the claim that found it either moved the position past it (a claim
 * scans with a snapshot taken after S) or kept the position (below).  A
 * position the claim found and did not settle (another session held it, its
 * endpoint was backed up, its rate or the byte budget stopped it, it has a
 * batch open, an old batch completed, its ordered batch waits for the
 * worker's own requests) is kept by this worker and looked at again at its
 * next claim, whatever its key.  A sweep looks at every read key with
 * events in the event tables: at a worker's start, after any ERROR in its
 * units of work (what it kept may be lost), when event subscriptions were
 * created, resumed or changed (a position made visible, or a hold lifted,
 * after the snapshot that saw its events), and every
 * EG_CLAIM_SWEEP_INTERVAL_MS (what a worker that left kept, and leases
 * recovery took back).  The cost of a sweep is that of the read keys the
 * event tables hold, which rotation bounds; with nothing published it
 * finds nothing.
 */
#include "store/store.h"
#include "store/store_sql.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define EG_CLAIM_SWEEP_INTERVAL_MS 2000
#define EG_CLAIM_NEW_DOMAIN_EVENTS 1000	/* more new events of domains: all domain topics with events are swept */

/*
 * $1: the last discovery's snapshot (NULL: a sweep); $2: this worker's
 * lease owner.  Returns this statement's snapshot (the next discovery's
 * $1), and the subscriptions of the read keys found, of this cluster, not
 * held and not leased by another worker: the push subscriptions' (claimed)
 * and the queue subscriptions' (transferred), each sorted.  The positions
 * the worker kept are added in C (the claim scan and the transfer check
 * those again themselves).  The topics in the
 * event tables come from a loose scan of events_batch_idx, a sweep's
 * domain topics from one of events_read_key_idx.  A transaction in progress
 * at $1 is looked up by its own id (unnest: as "txid = ANY (xip)" the
 * generic plan filtered every event of the topic, 10 ms a look beside
 * 50,000 events).
 */
static EgStatement discovery = {
	.name = "claim candidates",
	.sql =
	"WITH RECURSIVE since AS MATERIALIZED ("
	"  SELECT $1::pg_snapshot AS s, pg_snapshot_xmax($1::pg_snapshot) AS xmax,"
	"         ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot)) AS xip"
	"), topics(topic) AS ("
	"  (SELECT e.topic FROM eventgrid.events e ORDER BY e.topic LIMIT 1)"
	"  UNION ALL"
	"  SELECT (SELECT e.topic FROM eventgrid.events e WHERE e.topic > t.topic ORDER BY e.topic LIMIT 1)"
	"    FROM topics t WHERE t.topic IS NOT NULL"
	/*
	 * a domain's new events, read by (topic, txid): only those past the last
	 * look, at most EG_CLAIM_NEW_DOMAIN_EVENTS of them (a burst's domain
	 * topics are cheaper to sweep, a probe each, than to read event by event)
	 */
	"), news AS MATERIALIZED ("
	"  SELECT t.topic, n.domain_topic FROM since CROSS JOIN topics t"
	"    JOIN eventgrid.domains dm ON dm.name = t.topic"
	"    CROSS JOIN LATERAL ("
	"      (SELECT e.domain_topic FROM eventgrid.events e WHERE e.topic = t.topic AND e.txid >= since.xmax"
	"       UNION ALL"
	"       SELECT x.domain_topic FROM unnest(since.xip) i(txid) CROSS JOIN LATERAL ("
	"         SELECT e.domain_topic FROM eventgrid.events e WHERE e.topic = t.topic AND e.txid = i.txid) x)"
	"      LIMIT " CppAsString2(EG_CLAIM_NEW_DOMAIN_EVENTS) " + 1) n"
	"   WHERE since.s IS NOT NULL"
	"), sweep AS MATERIALIZED ("
	"  SELECT $1 IS NULL OR (SELECT count(*) FROM news) > " CppAsString2(EG_CLAIM_NEW_DOMAIN_EVENTS) " AS all_keys"
	"), swept(read_key) AS ("
	"  (SELECT " EG_SQL_EVENT_READ_KEY " FROM eventgrid.events e"
	"    WHERE (SELECT all_keys FROM sweep) AND e.domain_topic IS NOT NULL ORDER BY " EG_SQL_EVENT_READ_KEY " LIMIT 1)"
	"  UNION ALL"
	"  SELECT (SELECT " EG_SQL_EVENT_READ_KEY " FROM eventgrid.events e"
	"           WHERE e.domain_topic IS NOT NULL AND " EG_SQL_EVENT_READ_KEY " > d.read_key"
	"           ORDER BY " EG_SQL_EVENT_READ_KEY " LIMIT 1)"
	"    FROM swept d WHERE d.read_key IS NOT NULL"
	"), keys AS MATERIALIZED ("
	"  SELECT t.topic, NULL::text AS domain_topic FROM topics t CROSS JOIN since"
	"   WHERE t.topic IS NOT NULL AND (since.s IS NULL"
	"      OR EXISTS (SELECT 1 FROM eventgrid.events e WHERE e.topic = t.topic AND e.txid >= since.xmax)"
	"      OR EXISTS (SELECT 1 FROM unnest(since.xip) i(txid) CROSS JOIN LATERAL ("
	"                   SELECT 1 FROM eventgrid.events e WHERE e.topic = t.topic AND e.txid = i.txid LIMIT 1) x))"
	"  UNION"
	"  SELECT split_part(d.read_key, '/', 1), substr(d.read_key, strpos(d.read_key, '/') + 1)"
	"    FROM swept d WHERE d.read_key IS NOT NULL"
	"  UNION"
	"  SELECT n.topic, n.domain_topic FROM news n WHERE n.domain_topic IS NOT NULL"
	"), cand AS MATERIALIZED ("
	/* per key (OFFSET 0: a probe of the (topic, domain_topic, name) index each, never a scan of all) */
	"  SELECT x.id FROM keys k CROSS JOIN LATERAL ("
	"    SELECT s.id FROM eventgrid.event_subscriptions s"
	"     WHERE s.topic = k.topic AND s.domain_topic IS NULL AND k.domain_topic IS NULL"
	"    UNION ALL"
	"    SELECT s.id FROM eventgrid.event_subscriptions s"
	"     WHERE s.topic = k.topic AND s.domain_topic = k.domain_topic"
	"    OFFSET 0) x"
	"), pos AS MATERIALIZED ("
	"  SELECT x.id, x.queue FROM cand c CROSS JOIN LATERAL ("
	"    SELECT p.subscription_id AS id, s.delivery_mode = 'queue' AS queue"
	"      FROM eventgrid.subscription_positions p JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id"
	"     WHERE p.subscription_id = c.id AND p.system_identifier = eventgrid._system_identifier()"
	"       AND (p.lease_owner IS NULL OR p.lease_owner = $2)"
	"       AND NOT " EG_SQL_HELD("s")
	"    OFFSET 0) x"
	")"
	"SELECT pg_current_snapshot()::text,"
	"       ARRAY(SELECT pos.id FROM pos WHERE NOT pos.queue ORDER BY pos.id),"
	"       ARRAY(SELECT pos.id FROM pos WHERE pos.queue ORDER BY pos.id)",
	.nargs = 2,
	.types = {TEXTOID, INT4OID},
	.generic = true,
};

/* the last discovery's snapshot (NULL: sweep next), in TopMemoryContext */
static char *since = NULL;
static TimestampTz last_sweep_at = 0;

/* the positions kept for the next claim, push and queue ones (TopMemoryContext) */
typedef struct EgKept
{
	int64	   *ids;
	int			n;
	int			cap;
} EgKept;
static EgKept kept[2];

/* See store.h. */
void
eg_store_claim_sweep(void)
{
	if (since != NULL)
		pfree(since);
	since = NULL;
}

/* See store.h. */
void
eg_store_claim_keep(int64 subscription_id, bool queue)
{
	EgKept	   *k = &kept[queue ? 1 : 0];

	if (k->n == k->cap)
	{
		k->cap = Max(k->cap * 2, 64);
		k->ids = k->ids == NULL ? MemoryContextAlloc(TopMemoryContext, k->cap * sizeof(int64))
			: repalloc(k->ids, k->cap * sizeof(int64));
	}
	k->ids[k->n++] = subscription_id;
}

/*
 * The sorted ids of found (nfound, sorted) and of the kept list k, each
 * once, palloc'd; *n of them.  k is emptied: what this claim keeps is
 * written to it anew.
 */
static int64 *
merge_kept(int64 *found, int nfound, EgKept *k, int *n)
{
	int64	   *ids = palloc(Max(nfound + k->n, 1) * sizeof(int64));

	memcpy(ids, found, nfound * sizeof(int64));
	if (k->n > 0)
		memcpy(ids + nfound, k->ids, k->n * sizeof(int64));
	*n = nfound + k->n;
	k->n = 0;
	if (*n > 1)
	{
		int			m = 1;

		qsort(ids, *n, sizeof(int64), eg_cmp_int64);
		for (int i = 1; i < *n; i++)
			if (ids[i] != ids[m - 1])
				ids[m++] = ids[i];
		*n = m;
	}
	pfree(found);
	return ids;
}

/* See store.h. */
void
eg_store_claim_candidates(int lease_owner, TimestampTz now, EgClaimCandidates *c)
{
	Datum		args[2];
	char		nulls[2] = {' ', ' '};
	SPITupleTable *tt;
	int64	   *found;
	int			nfound;

	if (now - last_sweep_at >= (TimestampTz) EG_CLAIM_SWEEP_INTERVAL_MS * 1000 || now < last_sweep_at)
		eg_store_claim_sweep();
	if (since == NULL)
	{
		nulls[0] = 'n';
		args[0] = (Datum) 0;
		last_sweep_at = now;
	}
	else
		args[0] = CStringGetTextDatum(since);
	args[1] = Int32GetDatum(lease_owner);
	eg_store_run_nulls(&discovery, args, nulls, SPI_OK_SELECT);
	tt = SPI_tuptable;
	c->swept = since == NULL;

	/*
	 * From here on the kept positions are what this claim keeps; an ERROR
	 * before its unit commits sweeps (eg_store_claim_sweep()), so nothing
	 * it dropped is lost.
	 */
	found = eg_int8_array_col(tt, 0, 2, &nfound);
	c->push = merge_kept(found, nfound, &kept[0], &c->npush);
	found = eg_int8_array_col(tt, 0, 3, &nfound);
	c->queue = merge_kept(found, nfound, &kept[1], &c->nqueue);
	eg_store_claim_sweep();
	since = MemoryContextStrdup(TopMemoryContext, eg_text_col(tt, 0, 1));
}
