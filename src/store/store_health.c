/*
 * store_health.c - endpoint health (SPEC section 6) kept across runs of the
 * delivery workers in eventgrid.endpoint_states: written with the outcomes
 * that changed it, read back when a worker starts, and forgotten for URLs
 * no event subscription uses any more.  Outcome names are made and read
 * here, at the SQL boundary.
 */
#include "store/store.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/* Endpoint health (SPEC 6), written only by the delivery workers. */
static EgStatement health_load = {
	.name = "endpoint health load",
	.sql =
	"SELECT endpoint, state, consecutive_failures, last_failure_outcome, probation_cause,"
	"       probation_started_at, probation_until, probations"
	"  FROM eventgrid.endpoint_states",
};

enum
{
	HL_ENDPOINT = 1,
	HL_STATE,
	HL_FAILURES,
	HL_LAST_FAILURE,
	HL_CAUSE,
	HL_STARTED_AT,
	HL_UNTIL,
	HL_PROBATIONS
};

/*
 * The health of every endpoint as the delivery workers
 * left it (SPEC 6); *rows stay valid until eg_store_commit().
 */
int
eg_store_load_health(EgHealth **rows)
{
	SPITupleTable *tt;
	int			n;
	EgHealth   *out;

	eg_store_run(&health_load, NULL, SPI_OK_SELECT);
	n = (int) SPI_processed;
	tt = SPI_tuptable;
	out = palloc0(Max(n, 1) * sizeof(EgHealth));
	for (int i = 0; i < n; i++)
	{
		out[i].endpoint = eg_text_col(tt, i, HL_ENDPOINT);
		out[i].state = eg_text_col(tt, i, HL_STATE);
		out[i].consecutive_failures = eg_int32_col(tt, i, HL_FAILURES, 0);
		out[i].last_failure_outcome = eg_outcome_parse(eg_text_col(tt, i, HL_LAST_FAILURE));
		out[i].probation_cause = eg_outcome_parse(eg_text_col(tt, i, HL_CAUSE));
		out[i].probation_started_at = eg_timestamp_col(tt, i, HL_STARTED_AT);
		out[i].probation_until = eg_timestamp_col(tt, i, HL_UNTIL);
		out[i].probations = eg_int32_col(tt, i, HL_PROBATIONS, 0);
	}
	*rows = out;
	return n;
}

/* a healthy endpoint with no failures in a row needs no row */
static EgStatement health_save = {
	.name = "endpoint health save",
	.sql =
	"WITH h AS ("
	"  SELECT * FROM unnest($1::text[], $2::text[], $3::int4[], $4::text[], $5::text[],"
	"                       $6::timestamptz[], $7::timestamptz[], $8::int4[])"
	"         AS h(endpoint, state, consecutive_failures, last_failure_outcome, probation_cause,"
	"              probation_started_at, probation_until, probations)"
	"), gone AS ("
	"  DELETE FROM eventgrid.endpoint_states s USING h"
	"   WHERE s.endpoint = h.endpoint AND h.state = 'healthy' AND h.consecutive_failures = 0"
	")"
	"INSERT INTO eventgrid.endpoint_states AS s (endpoint, state, consecutive_failures, last_failure_outcome,"
	"       probation_cause, probation_started_at, probation_until, probations, updated_at)"
	"SELECT h.*, $9 FROM h WHERE NOT (h.state = 'healthy' AND h.consecutive_failures = 0)"
	"    ON CONFLICT (endpoint) DO UPDATE"
	"   SET state = excluded.state, consecutive_failures = excluded.consecutive_failures,"
	"       last_failure_outcome = excluded.last_failure_outcome, probation_cause = excluded.probation_cause,"
	"       probation_started_at = excluded.probation_started_at, probation_until = excluded.probation_until,"
	"       probations = excluded.probations, updated_at = excluded.updated_at",
	.nargs = 9,
	.types = {TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, TIMESTAMPTZARRAYOID, INT4ARRAYOID, TIMESTAMPTZOID},
};

/* Writes the health of n endpoints, as of now (SPEC 6). */
void
eg_store_save_health(const EgHealth *rows, int n, TimestampTz now)
{
	const char **endpoints = palloc(Max(n, 1) * sizeof(char *));
	const char **states = palloc(Max(n, 1) * sizeof(char *));
	const char **lasts = palloc(Max(n, 1) * sizeof(char *));
	const char **causes = palloc(Max(n, 1) * sizeof(char *));
	Datum	   *failures = palloc(Max(n, 1) * sizeof(Datum));
	Datum	   *probations = palloc(Max(n, 1) * sizeof(Datum));
	Datum	   *started = palloc(Max(n, 1) * sizeof(Datum));
	Datum	   *until = palloc(Max(n, 1) * sizeof(Datum));
	bool	   *started_null = palloc(Max(n, 1) * sizeof(bool));
	bool	   *until_null = palloc(Max(n, 1) * sizeof(bool));
	Datum		args[9];

	if (n == 0)
		return;
	for (int i = 0; i < n; i++)
	{
		endpoints[i] = rows[i].endpoint;
		states[i] = rows[i].state;
		lasts[i] = eg_outcome_name(rows[i].last_failure_outcome);
		causes[i] = eg_outcome_name(rows[i].probation_cause);
		failures[i] = Int32GetDatum(rows[i].consecutive_failures);
		probations[i] = Int32GetDatum(rows[i].probations);
		started_null[i] = rows[i].probation_started_at == 0;
		started[i] = TimestampTzGetDatum(rows[i].probation_started_at);
		until_null[i] = rows[i].probation_until == 0;
		until[i] = TimestampTzGetDatum(rows[i].probation_until);
	}
	args[0] = eg_text_array(endpoints, n);
	args[1] = eg_text_array(states, n);
	args[2] = eg_make_array(failures, NULL, n, INT4OID);
	args[3] = eg_text_array(lasts, n);
	args[4] = eg_text_array(causes, n);
	args[5] = eg_make_array(started, started_null, n, TIMESTAMPTZOID);
	args[6] = eg_make_array(until, until_null, n, TIMESTAMPTZOID);
	args[7] = eg_make_array(probations, NULL, n, INT4OID);
	args[8] = TimestampTzGetDatum(now);
	eg_store_run(&health_save, args, SPI_OK_INSERT);
}

static EgStatement health_forget = {
	.name = "endpoint health cleanup",
	.sql =
	"DELETE FROM eventgrid.endpoint_states h"
	" WHERE NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s WHERE s.endpoint = h.endpoint)",
};

/* Forgets the health of endpoint URLs that no event subscription uses any more. */
void
eg_store_forget_health(void)
{
	eg_store_run(&health_forget, NULL, SPI_OK_DELETE);
}

