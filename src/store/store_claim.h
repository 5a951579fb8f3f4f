/*
 * store_claim.h - what the two claims share (store_claim.c and
 * store_claim_load.c, first attempts; store_claim_retries.c, due retries):
 * the columns each returns for a
 * request, as SQL fragments, the enum naming them, and the function that
 * reads them from a result row.
 */
#ifndef EVENTGRID_STORE_CLAIM_H
#define EVENTGRID_STORE_CLAIM_H

#include "store/store.h"
#include "store/store_sql.h"
#include "store/store_batch_order.h"

/*
 * Static custom headers once per subscription among those in sub_ids.
 * MATERIALIZED: computed once per statement; inlined, the planner rescans
 * the aggregate and its index once per claimed row.
 */
#define PROPS(sub_ids) \
	"props AS MATERIALIZED (" \
	"  SELECT p.subscription_id," \
	"         string_agg(p.header || ': ' || p.value, E'\\n') FILTER (WHERE p.source_field IS NULL) AS static_headers," \
	"         bool_or(p.source_field IS NOT NULL) AS has_dynamic" \
	"    FROM eventgrid.delivery_properties p" \
	"   WHERE p.subscription_id = ANY (" sub_ids ")" \
	"   GROUP BY p.subscription_id" \
	")"

/*
 * Standard Webhooks signing keys once per subscription among those in
 * sub_ids: the secret, then (space-separated) a previous one still valid.
 */
#define KEYS(sub_ids) \
	"keys AS MATERIALIZED (" \
	"  SELECT k.subscription_id," \
	"         concat_ws(' ', k.secret, CASE WHEN k.previous_valid_until > now() THEN k.previous_secret END) AS keys" \
	"    FROM eventgrid.signing_secrets k" \
	"   WHERE k.subscription_id = ANY (" sub_ids ")" \
	")"

/*
 * When the client certificate of each subscription among sub_ids was set
 * (the worker loads the certificate itself once per change:
 * eg_store_client_certificate()).
 */
#define CERTS(sub_ids) \
	"certs AS MATERIALIZED (" \
	"  SELECT c.subscription_id, c.set_at" \
	"    FROM eventgrid.client_certificates c" \
	"   WHERE c.subscription_id = ANY (" sub_ids ")" \
	")"

/*
 * When the delivery authentication (bearer tokens) of each subscription
 * among sub_ids was set (the worker loads the credentials itself once per
 * change: eg_store_delivery_authentication()).
 */
#define AUTHS(sub_ids) \
	"auths AS MATERIALIZED (" \
	"  SELECT a.subscription_id, a.set_at" \
	"    FROM eventgrid.delivery_authentications a" \
	"   WHERE a.subscription_id = ANY (" sub_ids ")" \
	")"

/* Custom headers of subscription s for event ev: static ones from props pr, dynamic ones per event. */
#define CUSTOM_HEADERS(ev) \
	"nullif(concat_ws(E'\\n', pr.static_headers, CASE WHEN pr.has_dynamic THEN" \
	"  (SELECT string_agg(p.header || ': ' || v.value, E'\\n')" \
	"     FROM eventgrid.delivery_properties p" \
	"     CROSS JOIN LATERAL (SELECT CASE" \
	"          WHEN jsonb_typeof(" ev " #> string_to_array(p.source_field, '.')) IN ('string', 'number', 'boolean')" \
	"          THEN " ev " #>> string_to_array(p.source_field, '.') END AS value) v" \
	"    WHERE p.subscription_id = s.id AND p.source_field IS NOT NULL AND v.value IS NOT NULL" \
	"      AND v.value !~ '[\\x01-\\x1f\\x7f]' AND octet_length(v.value) <= 4096) END), '')"

/*
 * The columns both claims return for a request (of event ev, whose id
 * column is event_id, delivered as payload), in the order of enum
 * RequestCol: limits and batching of the subscription, the delivered text,
 * and the values of the aeg-* and custom headers.
 */
#define REQUEST_COLS(ev, event_id, payload, source, okey) \
	" s.max_delivery_attempts, s.endpoint, s.name, s.event_delivery_schema," \
	" s.max_events_per_batch, s.preferred_batch_size_in_kilobytes, " payload "," \
	" coalesce(" ev "->>'id', " event_id "::text)," \
	" coalesce(" ev "->>'dataVersion', '')," \
	" CASE WHEN s.event_delivery_schema = 'CloudEventSchemaV1_0' THEN '1.0' ELSE '1' END," \
	" " CUSTOM_HEADERS(ev) "," \
	" kk.keys, " source ", cc.set_at, au.set_at, s.endpoint_type, " okey
enum RequestCol
{
	RC_MAX_ATTEMPTS,
	RC_ENDPOINT,
	RC_NAME,
	RC_SCHEMA,
	RC_MAX_EVENTS,
	RC_PREFERRED_KB,
	RC_PAYLOAD,
	RC_OUTPUT_EVENT_ID,
	RC_DATA_VERSION,
	RC_METADATA_VERSION,
	RC_CUSTOM_HEADERS,
	RC_SIGNING_KEYS,
	RC_SOURCE,
	RC_CLIENT_CERT_SET_AT,
	RC_AUTH_SET_AT,
	RC_ENDPOINT_TYPE,
	RC_ORDERING_KEY,			/* the event's ordering key (SPEC 13), or NULL */
	RC_COUNT
};

/*
 * The REQUEST_COLS columns of result row row, starting at column first,
 * into r (texts borrowed from the result, valid until eg_store_commit()).
 * prev, the row before (or NULL): the texts it holds the same (a
 * subscription's endpoint, names and headers) are shared with it, not
 * copied again for each row.
 */
extern void eg_claim_request_cols(SPITupleTable *tt, int row, int first, EgClaimedRow *r,
								  const EgClaimedRow *prev);

/*
 * First attempts, step three (store_claim_load.c): what the chunks
 * written[0..nchunks) of lease owner lease_owner deliver, ordered by chunk
 * and (txid, id); *n rows, valid until eg_store_commit(); expired by the
 * clock now.  A chunk that gives nothing (its subscription's filters were
 * changed between the steps) is no longer in flight.
 */
extern EgClaimedRow *eg_claim_load_chunks(Datum *written, int nchunks, TimestampTz now, int lease_owner,
										  int *n);

#endif							/* EVENTGRID_STORE_CLAIM_H */
