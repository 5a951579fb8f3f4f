/*
 * store_claim_retries.c - claiming due retries (SPEC sections 3 and 4) from
 * eventgrid.retries, leased to the claiming delivery worker, within its
 * byte budget and each rate-limited subscription's tokens; when the next
 * retry is due; and fresh statistics for the retries table.
 */
#include "store/store_claim.h"
#include "core/rate.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/*
 * Due retries, within the byte budget $5, leased to $3 until $4 ms after
 * $1.  A retry leased by a running delivery worker is not taken; one leased
 * by a worker that no longer runs is, once its lease ran out.  Custom
 * headers are looked up once per subscription (props), and per row only
 * for the subscriptions whose headers take values from the event.
 */
static EgStatement claim_retries = {
	.name = "retry claim",
	.sql =
	"WITH due AS ("
	"  SELECT r.ctid AS tid, r.next_attempt_at, r.id, r.event_bytes FROM eventgrid.retries r"
	"   WHERE r.next_attempt_at <= $1 AND (r.lease_owner IS NULL OR r.lease_owner <> ALL (" EG_SQL_LIVE_WORKERS "))"
	"     AND r.subscription_id NOT IN (SELECT ps FROM eventgrid._held_subscriptions() ps)"
	"   ORDER BY r.next_attempt_at"
	"   LIMIT $2"
	"   FOR UPDATE SKIP LOCKED"
	"), sized AS ("
	"  SELECT due.tid, sum(due.event_bytes + " CppAsString2(EG_DELIVERY_OVERHEAD_BYTES) ") OVER w"
	"                  - due.event_bytes - " CppAsString2(EG_DELIVERY_OVERHEAD_BYTES) " AS before"
	"    FROM due WINDOW w AS (ORDER BY due.next_attempt_at, due.id ROWS UNBOUNDED PRECEDING)"
	"), claimed AS ("
	"  UPDATE eventgrid.retries r"
	"     SET next_attempt_at = $1 + $4 * interval '1 millisecond', lease_owner = $3"
	"   WHERE r.ctid = ANY (ARRAY(SELECT tid FROM sized WHERE before < $5))"
	"  RETURNING r.*"
	"), " PROPS("ARRAY(SELECT DISTINCT c.subscription_id FROM claimed c)")
	", " KEYS("ARRAY(SELECT DISTINCT c.subscription_id FROM claimed c)")
	", " CERTS("ARRAY(SELECT DISTINCT c.subscription_id FROM claimed c)")
	", " AUTHS("ARRAY(SELECT DISTINCT c.subscription_id FROM claimed c)")
	" SELECT c.id, s.id, c.attempts,"
	"       (s.id IS NOT NULL AND c.publish_time + make_interval(mins => s.event_ttl) <= $1),"
	"       c.last_outcome, c.last_http_status, c.last_attempt_at, c.event_bytes,"
	"       s.topic_type = 'namespace', c.event_id, s.topic, s.max_events_per_second, c.publish_time,"
	/* the key it waited under; one that waited unordered takes the subscription's key now */
	REQUEST_COLS("c.event", "c.event_id", "c.payload", "c.source",
				 "coalesce(c.ordering_key, CASE WHEN s.ordering_key IS NOT NULL"
				 "                              THEN eventgrid._ordering_key(c.event, s.ordering_key) END)")
	"  FROM claimed c"
	"  LEFT JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id"
	"  LEFT JOIN props pr ON pr.subscription_id = s.id"
	"  LEFT JOIN keys kk ON kk.subscription_id = s.id"
	"  LEFT JOIN certs cc ON cc.subscription_id = s.id"
	"  LEFT JOIN auths au ON au.subscription_id = s.id"
	" ORDER BY s.id NULLS FIRST, c.next_attempt_at, c.id",
	.nargs = 5,
	.types = {TIMESTAMPTZOID, INT4OID, INT4OID, INT8OID, INT8OID},
};
enum
{
	CR_RETRY_ID = 1,
	CR_SUBSCRIPTION_ID,
	CR_ATTEMPTS,
	CR_EXPIRED,
	CR_LAST_OUTCOME,
	CR_LAST_HTTP_STATUS,
	CR_LAST_ATTEMPT_AT,
	CR_BYTES,
	CR_NAMESPACE,
	CR_EVENT_ID,
	CR_TOPIC,
	CR_RATE,
	CR_PUBLISH_TIME,
	CR_REQUEST				/* REQUEST_COLS from here */
};

/* Retries a claim took over their subscription's rate: due again when it has a token. */
static EgStatement release_retries = {
	.name = "retry release",
	.sql =
	"UPDATE eventgrid.retries r SET lease_owner = NULL, next_attempt_at = $2 WHERE r.id = ANY ($1)",
	.nargs = 2,
	.types = {INT8ARRAYOID, TIMESTAMPTZOID},
};

/*
 * Keeps of each rate-limited subscription's claimed retries (rows ordered
 * by subscription) as many as it has tokens for; the others are released,
 * due when the next token comes (eg_rate_next_at).  Returns the rows kept.
 */
static int
rate_limit_retries(EgClaimedRow *out, const int *rates, int n, TimestampTz now)
{
	int			kept = 0;
	int			nreleased = 0;
	Datum	   *released = NULL;

	for (int i = 0; i < n;)
	{
		int			j = i;
		int			granted;

		while (j < n && out[j].subscription_id == out[i].subscription_id)
			j++;
		granted = rates[i] > 0 && out[i].subscription_id != 0
			? eg_rate_take(out[i].subscription_id, rates[i], j - i, now) : j - i;
		for (int m = i; m < j; m++)
		{
			if (m - i < granted)
				out[kept++] = out[m];
			else
			{
				if (released == NULL)
					released = palloc(n * sizeof(Datum));
				released[nreleased++] = Int64GetDatum(out[m].retry_id);
			}
		}
		i = j;
	}
	if (nreleased > 0)
	{
		Datum		args[2];

		args[0] = eg_make_array(released, NULL, nreleased, INT8OID);
		args[1] = TimestampTzGetDatum(eg_rate_next_at);
		eg_store_run(&release_retries, args, SPI_OK_UPDATE);
	}
	return kept;
}

/*
 * Claims up to limit due retries whose events add up to about byte_budget
 * bytes (at least one), leasing them to lease_owner for lease_ms, ordered
 * by subscription; of a rate-limited subscription only as many as it has
 * tokens for (rate_limit_retries).  *rows (allocated in the unit of work)
 * stay valid until eg_store_commit(); event texts are not copied.
 */
int
eg_store_claim_retries(TimestampTz now, int limit, int64 byte_budget, int lease_owner, int64 lease_ms,
					   EgClaimedRow **rows)
{
	Datum		args[5];
	SPITupleTable *tt;
	int			n;
	EgClaimedRow *out;
	int		   *rates;
	bool		limited = false;

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int32GetDatum(limit);
	args[2] = Int32GetDatum(lease_owner);
	args[3] = Int64GetDatum(lease_ms);
	args[4] = Int64GetDatum(Max(byte_budget, 1));
	eg_store_run(&claim_retries, args, SPI_OK_SELECT);
	n = (int) SPI_processed;
	tt = SPI_tuptable;
	out = palloc0(Max(n, 1) * sizeof(EgClaimedRow));
	rates = palloc(Max(n, 1) * sizeof(int));
	for (int i = 0; i < n; i++)
	{
		EgClaimedRow *r = &out[i];

		r->retry_id = eg_int64_col(tt, i, CR_RETRY_ID, 0);
		r->subscription_id = eg_int64_col(tt, i, CR_SUBSCRIPTION_ID, 0);
		r->attempts = eg_int32_col(tt, i, CR_ATTEMPTS, 0);
		r->expired = eg_bool_col(tt, i, CR_EXPIRED);
		r->prev_outcome = eg_outcome_parse(eg_text_col(tt, i, CR_LAST_OUTCOME));
		r->prev_http_status = eg_int32_col(tt, i, CR_LAST_HTTP_STATUS, 0);
		r->prev_attempted_at = eg_timestamp_col(tt, i, CR_LAST_ATTEMPT_AT);
		r->bytes = eg_int32_col(tt, i, CR_BYTES, 0) + EG_DELIVERY_OVERHEAD_BYTES;
		r->profile = eg_bool_col(tt, i, CR_NAMESPACE) ? EG_PROFILE_NAMESPACE : EG_PROFILE_CUSTOM;
		r->event_id = eg_int64_col(tt, i, CR_EVENT_ID, 0);
		r->topic = eg_text_col(tt, i, CR_TOPIC);
		rates[i] = eg_int32_col(tt, i, CR_RATE, 0);
		r->publish_time = eg_timestamp_col(tt, i, CR_PUBLISH_TIME);
		if (rates[i] > 0)
			limited = true;
		eg_claim_request_cols(tt, i, CR_REQUEST, r, i > 0 ? &out[i - 1] : NULL);
	}
	if (limited)
		n = rate_limit_retries(out, rates, n, now);
	pfree(rates);
	*rows = out;
	return n;
}

/* Earliest due time of retries that no running delivery worker holds, of subscriptions not held (paused, endpoint not validated). */
static EgStatement next_due = {
	.name = "next due time",
	.sql =
	"SELECT min(r.next_attempt_at) FROM eventgrid.retries r"
	" WHERE (r.lease_owner IS NULL OR r.lease_owner <> ALL (" EG_SQL_LIVE_WORKERS "))"
	"   AND r.subscription_id NOT IN (SELECT ps FROM eventgrid._held_subscriptions() ps)",
};

/*
 * Earliest next_attempt_at of retries that no running delivery worker holds
 * (unleased, or leased by a worker that no longer runs), or DT_NOEND.
 */
TimestampTz
eg_store_next_due(void)
{
	TimestampTz t;

	/* a new snapshot: retries made due since the claim began (another worker's promotion) count */
	eg_store_run(&next_due, NULL, SPI_OK_SELECT);
	t = eg_timestamp_col(SPI_tuptable, 0, 1);
	return t == 0 ? DT_NOEND : t;
}

/*
 * Fresh statistics for eventgrid.retries.  Queue tables swing between
 * empty and large; after a VACUUM finds one empty the planner believes it
 * empty until the next ANALYZE and picks nested loops that cost the square
 * of the rows per statement.  The event tables are always reached through
 * their index, in (topic, txid, id) order.
 */
void
eg_store_analyze(void)
{
	if (SPI_execute("ANALYZE eventgrid.retries", false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "eventgrid: ANALYZE of eventgrid.retries failed");
}
