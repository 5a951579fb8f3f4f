/*
 * store_claim_load.c - the first-attempt claim's third step (SPEC sections
 * 1, 2, 5 and 9): what the chunks the claim just wrote deliver, read the
 * way recovery reads a chunk, with what their requests need
 * (store_claim.h's request columns), and each event's JSON text made once
 * for all the subscriptions that get it.  Steps one and two (what to take,
 * moving the positions) are in store_claim.c.
 */
#include "store/store_claim.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

/*
 * First attempts, step three: the deliveries of the chunks $1 just written
 * by lease owner $2, read the way recovery reads a chunk (the events of its
 * range in its batch that its subscription's filters take), with what their
 * requests need; expired by the clock $3.  Unordered: eg_claim_load_chunks() orders
 * them by chunk and (txid, id), so that the wide rows with their events
 * are not sorted here.  An event that goes in its topic's own schema comes
 * as jsonb, and json_texts() makes its JSON text once for all the
 * subscriptions that get it; otherwise the converted text comes.
 */
static EgStatement claim_load = {
	.name = "chunk load",
	.sql =
	"WITH c AS MATERIALIZED ("
	"  SELECT c.* FROM eventgrid.chunks_in_flight c WHERE c.lease_owner = $2 AND c.chunk = ANY ($1)"
	"), " PROPS("ARRAY(SELECT c.subscription_id FROM c)")
	", " KEYS("ARRAY(SELECT c.subscription_id FROM c)")
	", " CERTS("ARRAY(SELECT c.subscription_id FROM c)")
	", " AUTHS("ARRAY(SELECT c.subscription_id FROM c)")
	" SELECT c.chunk, s.id, e.txid, e.id,"
	"       (e.publish_time + make_interval(mins => s.event_ttl) <= $3),"
	"       coalesce(e.event_bytes, 0), s.topic_type = 'namespace', s.topic,"
	"       CASE WHEN t.input_schema = s.event_delivery_schema THEN e.event END, e.publish_time,"
	"       s.ordering_key IS NOT NULL, k.h,"
	"       k.h IS NOT NULL AND EXISTS (SELECT 1 FROM eventgrid.ordering_keys ok"
	"                                    WHERE ok.subscription_id = s.id AND ok.ordering_key_hash = k.h),"
	REQUEST_COLS("e.event", "e.id",
				 "CASE WHEN t.input_schema = s.event_delivery_schema THEN NULL"
				 " ELSE eventgrid.convert_event(e.event, t.input_schema, s.event_delivery_schema,"
				 "                              e.publish_time)::text END", "e.source", "k.okey")
	"  FROM c JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id"
	"  JOIN eventgrid.topics t ON t.name = s.topic"
	EG_SQL_CHUNK_EVENTS
	/* the ordering key (SPEC 13), and its hash as eventgrid.retries.ordering_key_hash */
	"  CROSS JOIN LATERAL (SELECT o.okey, hashtextextended(o.okey, 0) AS h"
	"                        FROM (SELECT CASE WHEN s.ordering_key IS NOT NULL"
	"                                     THEN eventgrid._ordering_key(e.event, s.ordering_key) END AS okey) o) k"
	"  LEFT JOIN props pr ON pr.subscription_id = s.id"
	"  LEFT JOIN keys kk ON kk.subscription_id = s.id"
	"  LEFT JOIN certs cc ON cc.subscription_id = s.id"
	"  LEFT JOIN auths au ON au.subscription_id = s.id",
	.nargs = 3,
	.types = {INT8ARRAYOID, INT4OID, TIMESTAMPTZOID},
};
enum
{
	CL_CHUNK = 1,
	CL_SUBSCRIPTION_ID,
	CL_TXID,
	CL_EVENT_ID,
	CL_EXPIRED,
	CL_BYTES,
	CL_NAMESPACE,
	CL_TOPIC,
	CL_EVENT_JSONB,			/* the event when it goes in its topic's own schema */
	CL_PUBLISH_TIME,
	CL_ORDERED,				/* of an ordered subscription */
	CL_KEY_HASH,			/* its ordering key's hash, or NULL */
	CL_PARKED,				/* its key waits in the retries */
	CL_REQUEST				/* REQUEST_COLS from here */
};

/*
 * A chunk whose events the filters no longer take (the subscription was
 * changed between the steps of a claim) has nothing to send.
 */
static EgStatement drop_chunks = {
	.name = "empty chunk removal",
	.sql = "DELETE FROM eventgrid.chunks_in_flight WHERE lease_owner = $2 AND chunk = ANY ($1)",
	.nargs = 2,
	.types = {INT8ARRAYOID, INT4OID},
};

/* A delivery read by claim_load, with the keys it is ordered by. */
typedef struct EgLoadRow
{
	int64		chunk;
	uint64		txid;
	int64		id;
	HeapTuple	tuple;
	Datum		event;			/* the event as jsonb (json_texts()) */
} EgLoadRow;

static int
cmp_load_rows(const void *a, const void *b)
{
	const EgLoadRow *x = a;
	const EgLoadRow *y = b;

	if (x->chunk != y->chunk)
		return x->chunk < y->chunk ? -1 : 1;
	return cmp_event_key(x->txid, x->id, y->txid, y->id);
}

static int
cmp_load_events(const void *a, const void *b)
{
	const EgLoadRow *x = *(EgLoadRow *const *) a;
	const EgLoadRow *y = *(EgLoadRow *const *) b;

	return cmp_event_key(x->txid, x->id, y->txid, y->id);
}

/*
 * The JSON text of the rows out[0..n) (claim_load's, in the order of load)
 * that came as jsonb, made once per event: with fan-out, every
 * subscription that gets an event in the topic's own schema gets the same
 * text, which jsonb's own output function makes.
 */
static void
json_texts(SPITupleTable *tt, EgLoadRow *load, EgClaimedRow *out, int n)
{
	EgLoadRow **by_event = palloc(Max(n, 1) * sizeof(EgLoadRow *));
	int			m = 0;

	for (int i = 0; i < n; i++)
	{
		bool		isnull;

		load[i].event = SPI_getbinval(tt->vals[i], tt->tupdesc, CL_EVENT_JSONB, &isnull);
		if (!isnull)
			by_event[m++] = &load[i];
	}
	qsort(by_event, m, sizeof(EgLoadRow *), cmp_load_events);
	for (int i = 0; i < m;)
	{
		int			j = i;
		Jsonb	   *jb = DatumGetJsonbP(by_event[i]->event);
		char	   *text = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
		int			len = strlen(text);

		/*
		 * Held until the claim commits: no more than the text itself (its
		 * buffer may have room to spare), and not the unpacked copy of an
		 * event that came compressed or out of line.
		 */
		text = repalloc(text, len + 1);
		if ((Pointer) jb != DatumGetPointer(by_event[i]->event))
			pfree(jb);

		while (j < m && cmp_load_events(&by_event[j], &by_event[i]) == 0)
		{
			EgClaimedRow *r = &out[by_event[j] - load];	/* out and load share their order */

			r->payload.json = text;
			r->payload.len = len;
			j++;
		}
		i = j;
	}
	pfree(by_event);
}

/*
 * Step three: what the chunks written[0..nchunks) deliver, ordered by chunk
 * and (txid, id); *n rows.  A chunk that gave nothing (its subscription's
 * filters were changed between the steps) is not in flight.
 */
EgClaimedRow *
eg_claim_load_chunks(Datum *written, int nchunks, TimestampTz now, int lease_owner, int *n)
{
	Datum		args[3];
	SPITupleTable *tt;
	EgLoadRow  *load;
	EgClaimedRow *out;
	int			nempty = 0;

	args[0] = eg_make_array(written, NULL, nchunks, INT8OID);
	args[1] = Int32GetDatum(lease_owner);
	args[2] = TimestampTzGetDatum(now);
	eg_store_run(&claim_load, args, SPI_OK_SELECT);
	*n = (int) SPI_processed;
	tt = SPI_tuptable;
	load = palloc(Max(*n, 1) * sizeof(EgLoadRow));
	for (int i = 0; i < *n; i++)
	{
		load[i].tuple = tt->vals[i];
		load[i].chunk = eg_int64_col(tt, i, CL_CHUNK, 0);
		load[i].txid = (uint64) eg_int64_col(tt, i, CL_TXID, 0);
		load[i].id = eg_int64_col(tt, i, CL_EVENT_ID, 0);
	}
	qsort(load, *n, sizeof(EgLoadRow), cmp_load_rows);
	out = palloc0(Max(*n, 1) * sizeof(EgClaimedRow));
	for (int i = 0; i < *n; i++)
	{
		EgClaimedRow *r = &out[i];
		bool		isnull;

		tt->vals[i] = load[i].tuple;
		r->chunk = load[i].chunk;
		r->txid = load[i].txid;
		r->event_id = load[i].id;
		r->subscription_id = eg_int64_col(tt, i, CL_SUBSCRIPTION_ID, 0);
		r->expired = eg_bool_col(tt, i, CL_EXPIRED);
		r->bytes = eg_int32_col(tt, i, CL_BYTES, 0) + EG_DELIVERY_OVERHEAD_BYTES;
		r->profile = eg_bool_col(tt, i, CL_NAMESPACE) ? EG_PROFILE_NAMESPACE : EG_PROFILE_CUSTOM;
		r->topic = eg_text_col(tt, i, CL_TOPIC);
		if (i > 0 && r->topic && out[i - 1].topic && strcmp(r->topic, out[i - 1].topic) == 0)
		{
			pfree((char *) r->topic);
			r->topic = out[i - 1].topic;
		}
		r->publish_time = eg_timestamp_col(tt, i, CL_PUBLISH_TIME);
		r->ordered = eg_bool_col(tt, i, CL_ORDERED);
		(void) SPI_getbinval(tt->vals[i], tt->tupdesc, CL_KEY_HASH, &isnull);
		r->keyed = !isnull;
		r->key_hash = r->keyed ? eg_int64_col(tt, i, CL_KEY_HASH, 0) : 0;
		r->parked = eg_bool_col(tt, i, CL_PARKED);
		eg_claim_request_cols(tt, i, CL_REQUEST, r, i > 0 ? &out[i - 1] : NULL);
	}
	json_texts(tt, load, out, *n);

	for (int c = 0, i = 0; c < nchunks; c++)
	{
		int64		no = DatumGetInt64(written[c]);

		while (i < *n && out[i].chunk < no)
			i++;
		if (i >= *n || out[i].chunk != no)
			written[nempty++] = written[c];
	}
	if (nempty > 0)
	{
		args[0] = eg_make_array(written, NULL, nempty, INT8OID);
		args[1] = Int32GetDatum(lease_owner);
		eg_store_run(&drop_chunks, args, SPI_OK_DELETE);
	}
	return out;
}

