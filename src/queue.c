/*
 * queue.c - the delivery queue's SQL and SPI, behind a few functions: open
 * and commit a unit of work, claim due deliveries, record outcomes, note
 * requests in flight, find the next due time, and recover the leases of a
 * previous run (SPEC sections 2, 3, 4 and 7).  worker.c calls these from its
 * loop and knows nothing of tables or statements.
 *
 * Storage (sql/eventgrid--0.1.0.sql): one eventgrid.deliveries row per
 * event x subscription, leased by a claim (next_attempt_at pushed past the
 * response timeout, lease_owner set to the worker's pid), updated or
 * deleted when its outcome is recorded; eventgrid.requests_in_flight names
 * the deliveries handed to HTTP.
 *
 * Every statement is prepared when first used and kept; a unit of work is
 * one transaction.  The extension's presence and version are checked at the
 * start of each unit: a library and schema of different versions would run
 * statements against tables they were not written for.
 */
#include "eventgrid.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* The worker's statements, prepared when first used. */
typedef enum EgPlanId
{
	PLAN_CLAIM,
	PLAN_NEXT_DUE,
	PLAN_LOCK_EVENTS,
	PLAN_NO_SYNC,
	PLAN_RECORD,
	PLAN_CLEANUP,
	PLAN_WAVES_DONE,
	PLAN_IN_FLIGHT,
	PLAN_CHARGE_SENT,
	PLAN_RELEASE,
	PLAN_FORGET_WAVES,
	PLAN_COUNT
} EgPlanId;

typedef struct EgPlanDef
{
	const char *sql;
	int			nargs;
	Oid			types[9];
} EgPlanDef;

static const EgPlanDef plan_defs[PLAN_COUNT] = {
	/*
	 * The claim: due rows, within the byte budget, leased; each with its
	 * event converted to the delivery schema.  Custom headers are looked up
	 * once per subscription (props), and per row only for the subscriptions
	 * whose headers take values from the event (dynamic properties).
	 */
	[PLAN_CLAIM] = {
		"WITH due AS ("
		"  SELECT d.ctid AS tid, d.event_id, d.next_attempt_at, d.id FROM eventgrid.deliveries d"
		"   WHERE d.next_attempt_at <= $1 AND d.lease_owner IS DISTINCT FROM $3"
		"   ORDER BY d.next_attempt_at"
		"   LIMIT $2"
		"   FOR UPDATE SKIP LOCKED"
		"), sized AS ("
		"  SELECT due.tid, sum(coalesce(e.event_bytes, 0)) OVER w - coalesce(e.event_bytes, 0) AS before"
		"    FROM due LEFT JOIN eventgrid.events e ON e.id = due.event_id"
		"  WINDOW w AS (ORDER BY due.next_attempt_at, due.id ROWS UNBOUNDED PRECEDING)"
		"), claimed AS ("
		"  UPDATE eventgrid.deliveries d"
		"     SET next_attempt_at = $1 + $4 * interval '1 millisecond', lease_owner = $3"
		"   WHERE d.ctid = ANY (ARRAY(SELECT tid FROM sized WHERE before < $5))"
		"  RETURNING d.id, d.event_id, d.subscription_id, d.attempts,"
		"            d.last_outcome, d.last_http_status, d.last_attempt_at"
		"), props AS ("
		"  SELECT p.subscription_id,"
		"         string_agg(p.header || ': ' || p.value, E'\\n') FILTER (WHERE p.source_field IS NULL) AS static_headers,"
		"         bool_or(p.source_field IS NOT NULL) AS has_dynamic"
		"    FROM eventgrid.delivery_properties p"
		"   WHERE p.subscription_id = ANY (ARRAY(SELECT DISTINCT c.subscription_id FROM claimed c))"
		"   GROUP BY p.subscription_id"
		")"
		"SELECT c.id, c.subscription_id, c.attempts, s.max_delivery_attempts,"
		"       (s.id IS NOT NULL AND e.publish_time + make_interval(mins => s.event_ttl) <= $1) AS expired,"
		"       s.endpoint, s.name, s.event_delivery_schema,"
		"       s.max_events_per_batch, s.preferred_batch_size_in_kilobytes,"
		"       (CASE WHEN t.input_schema = s.event_delivery_schema THEN e.event"
		"             ELSE eventgrid.convert_event(e.event, t.input_schema, s.event_delivery_schema, e.publish_time) END)::text,"
		"       coalesce(e.event->>'id', e.id::text),"
		"       coalesce(e.event->>'dataVersion', ''),"
		"       CASE WHEN s.event_delivery_schema = 'CloudEventSchemaV1_0' THEN '1.0' ELSE '1' END,"
		"       nullif(concat_ws(E'\\n', pr.static_headers, CASE WHEN pr.has_dynamic THEN"
		"         (SELECT string_agg(p.header || ': ' || v.value, E'\\n')"
		"            FROM eventgrid.delivery_properties p"
		"            CROSS JOIN LATERAL (SELECT CASE"
		"                 WHEN jsonb_typeof(e.event #> string_to_array(p.source_field, '.')) IN ('string', 'number', 'boolean')"
		"                 THEN e.event #>> string_to_array(p.source_field, '.') END AS value) v"
		"           WHERE p.subscription_id = s.id AND p.source_field IS NOT NULL AND v.value IS NOT NULL"
		"             AND v.value !~ '[\\x01-\\x1f\\x7f]' AND octet_length(v.value) <= 4096) END), ''),"
		"       c.last_outcome, c.last_http_status, c.last_attempt_at,"
		"       coalesce(e.event_bytes, 0)"
		"  FROM claimed c"
		"  LEFT JOIN eventgrid.events e ON e.id = c.event_id"
		"  LEFT JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id AND e.id IS NOT NULL"
		"  LEFT JOIN eventgrid.topics t ON t.name = s.topic"
		"  LEFT JOIN props pr ON pr.subscription_id = s.id"
		" ORDER BY c.subscription_id NULLS FIRST, c.id",
		5, {TIMESTAMPTZOID, INT4OID, INT4OID, INT8OID, INT8OID}
	},
	[PLAN_NEXT_DUE] = {
		"SELECT min(next_attempt_at) FROM eventgrid.deliveries WHERE lease_owner IS DISTINCT FROM $1",
		1, {INT4OID}
	},
	/* one lock order everywhere: events before deliveries (drop_topic does the same) */
	[PLAN_LOCK_EVENTS] = {"LOCK TABLE eventgrid.events IN ROW EXCLUSIVE MODE", 0, {0}},
	[PLAN_NO_SYNC] = {"SET LOCAL synchronous_commit = off", 0, {0}},

	/*
	 * One statement records a round: retries get their next attempt, finished
	 * rows are deleted and dead-lettered or counted.  d.id = ANY ($1) lets the
	 * primary key drive the join with the outcome arrays.
	 */
	[PLAN_RECORD] = {
		"WITH r AS ("
		"  SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::int4[], $5::timestamptz[],"
		"                       $6::timestamptz[], $7::text[], $8::int4[], $9::bool[])"
		"         AS r(id, action, outcome, status, attempted_at, next_at, reason, attempts, attempted)"
		"), retried AS ("
		"  UPDATE eventgrid.deliveries d"
		"     SET attempts = r.attempts, next_attempt_at = r.next_at, last_attempt_at = r.attempted_at,"
		"         last_outcome = r.outcome, last_http_status = r.status, lease_owner = NULL"
		"    FROM r WHERE d.id = ANY ($1) AND d.id = r.id AND r.action = 'r'"
		"  RETURNING d.subscription_id"
		"), finished AS ("
		"  DELETE FROM eventgrid.deliveries d USING r"
		"   WHERE d.id = ANY ($1) AND d.id = r.id AND r.action <> 'r'"
		"  RETURNING d.event_id, d.subscription_id, r.action, r.reason, r.attempts,"
		"            r.outcome, r.status, r.attempted_at, r.attempted"
		"), fin AS ("
		"  SELECT f.*, coalesce(s.deadletter, false) AS deadletter, s.topic, s.name, s.event_delivery_schema"
		"    FROM finished f LEFT JOIN eventgrid.event_subscriptions s ON s.id = f.subscription_id"
		"), dead AS ("
		"  INSERT INTO eventgrid.dead_letters (topic, subscription_name, subscription_id, input_schema,"
		"         event_delivery_schema, event, dead_letter_reason, delivery_attempts, last_delivery_outcome,"
		"         last_http_status_code, publish_time, last_delivery_attempt_time)"
		"  SELECT f.topic, f.name, f.subscription_id, t.input_schema, f.event_delivery_schema, e.event,"
		"         f.reason, f.attempts, f.outcome, f.status, e.publish_time, f.attempted_at"
		"    FROM fin f JOIN eventgrid.events e ON e.id = f.event_id JOIN eventgrid.topics t ON t.name = e.topic"
		"   WHERE f.action = 'f' AND f.deadletter"
		"), stats AS ("
		"  SELECT x.subscription_id, sum(x.delivered) AS delivered, sum(x.failed) AS failed,"
		"         sum(x.dead) AS dead, sum(x.dropped) AS dropped"
		"    FROM (SELECT subscription_id, 0 AS delivered, 1 AS failed, 0 AS dead, 0 AS dropped FROM retried"
		"          UNION ALL"
		"          SELECT subscription_id, (action = 'd')::int, (action = 'f' AND attempted)::int,"
		"                 (action = 'f' AND deadletter)::int, (action = 'f' AND NOT deadletter)::int"
		"            FROM fin WHERE subscription_id IS NOT NULL) x"
		"   GROUP BY x.subscription_id"
		"), counted AS ("
		"  UPDATE eventgrid.subscription_counters c"
		"     SET delivered = c.delivered + stats.delivered, failed_attempts = c.failed_attempts + stats.failed,"
		"         dead_lettered = c.dead_lettered + stats.dead, dropped = c.dropped + stats.dropped"
		"    FROM stats WHERE c.subscription_id = stats.subscription_id"
		"), unmatched AS ("
		"  UPDATE eventgrid.topic_counters c SET unmatched = c.unmatched + u.n"
		"    FROM (SELECT e.topic, count(*) AS n FROM fin f JOIN eventgrid.events e ON e.id = f.event_id"
		"           WHERE f.action = 'u' GROUP BY e.topic) u"
		"   WHERE c.topic = u.topic"
		")"
		"SELECT array_agg(DISTINCT event_id) FROM finished",
		9, {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID,
		TIMESTAMPTZARRAYOID, TEXTARRAYOID, INT4ARRAYOID, BOOLARRAYOID}
	},
	[PLAN_CLEANUP] = {
		"DELETE FROM eventgrid.events e WHERE e.id = ANY ($1)"
		"   AND NOT EXISTS (SELECT 1 FROM eventgrid.deliveries d WHERE d.event_id = e.id)",
		1, {INT8ARRAYOID}
	},
	[PLAN_WAVES_DONE] = {
		"DELETE FROM eventgrid.requests_in_flight WHERE lease_owner = $1 AND wave = ANY ($2)",
		2, {INT4OID, INT8ARRAYOID}
	},
	[PLAN_IN_FLIGHT] = {
		"INSERT INTO eventgrid.requests_in_flight (lease_owner, wave, delivery_ids) VALUES ($1, $2, $3)",
		3, {INT4OID, INT8OID, INT8ARRAYOID}
	},
	/* after a crash: an attempt for every delivery that went to HTTP, none for the rest */
	[PLAN_CHARGE_SENT] = {
		"UPDATE eventgrid.deliveries d"
		"   SET attempts = least(d.attempts + 1, 30), last_outcome = 'Aborted', last_http_status = NULL,"
		"       last_attempt_at = $2"
		"  FROM (SELECT DISTINCT unnest(f.delivery_ids) AS id FROM eventgrid.requests_in_flight f"
		"         WHERE f.lease_owner <> $1) sent"
		" WHERE d.id = sent.id AND d.lease_owner IS NOT NULL AND d.lease_owner <> $1",
		2, {INT4OID, TIMESTAMPTZOID}
	},
	[PLAN_RELEASE] = {
		"UPDATE eventgrid.deliveries SET next_attempt_at = least(next_attempt_at, $2), lease_owner = NULL"
		" WHERE lease_owner IS NOT NULL AND lease_owner <> $1",
		2, {INT4OID, TIMESTAMPTZOID}
	},
	[PLAN_FORGET_WAVES] = {
		"DELETE FROM eventgrid.requests_in_flight WHERE lease_owner <> $1",
		1, {INT4OID}
	},
};

static SPIPlanPtr plans[PLAN_COUNT];

EgReadiness eg_queue_readiness = EG_READY_UNKNOWN;

static SPIPlanPtr
get_plan(EgPlanId id)
{
	if (plans[id] == NULL)
	{
		const EgPlanDef *def = &plan_defs[id];
		SPIPlanPtr	plan = SPI_prepare(def->sql, def->nargs, (Oid *) def->types);

		if (plan == NULL)
			elog(ERROR, "eventgrid: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		plans[id] = plan;
	}
	return plans[id];
}

static void
free_plans(void)
{
	for (int i = 0; i < PLAN_COUNT; i++)
	{
		if (plans[i])
			SPI_freeplan(plans[i]);
		plans[i] = NULL;
	}
}

static void
run_plan(EgPlanId id, Datum *args, bool read_only, int expected)
{
	int			rc = SPI_execute_plan(get_plan(id), args, NULL, read_only, 0);

	if (rc != expected)
		elog(ERROR, "eventgrid: queue statement %d failed: %s", (int) id, SPI_result_code_string(rc));
}

static Datum
make_array(Datum *values, bool *nulls, int n, Oid elemtype)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};
	int16		typlen;
	bool		typbyval;
	char		typalign;

	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_md_array(values, nulls, 1, dims, lbs, elemtype,
											  typlen, typbyval, typalign));
}

static Datum
int8_array(const int64 *values, int n)
{
	Datum	   *d = palloc(Max(n, 1) * sizeof(Datum));

	for (int i = 0; i < n; i++)
		d[i] = Int64GetDatum(values[i]);
	return make_array(d, NULL, n, INT8OID);
}

/*
 * The schema's version: NULL when the extension is not installed.  Read from
 * pg_extension directly, without SQL, so that it works whatever the schema
 * holds.
 */
static char *
installed_version(void)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *version = NULL;

	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("eventgrid"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, Anum_pg_extension_extversion, RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * Is the extension installed here, in the version this library was built
 * for?  Logs each change of the answer once.  On a mismatch the worker idles
 * until ALTER EXTENSION eventgrid UPDATE.
 */
static bool
extension_ready(void)
{
	char	   *version = installed_version();
	EgReadiness now = version == NULL ? EG_READY_MISSING
		: strcmp(version, EG_VERSION) != 0 ? EG_READY_VERSION : EG_READY_OK;

	if (now != eg_queue_readiness)
	{
		if (now == EG_READY_MISSING)
			ereport(LOG,
					(errmsg("eventgrid: extension eventgrid is not installed in database \"%s\"; the delivery worker waits for it",
							get_database_name(MyDatabaseId)),
					 errhint("Run CREATE EXTENSION eventgrid in this database.")));
		else if (now == EG_READY_VERSION)
			ereport(LOG,
					(errmsg("eventgrid: the installed extension is version %s but the loaded library is version %s; the delivery worker idles",
							version, EG_VERSION),
					 errhint("Run ALTER EXTENSION eventgrid UPDATE TO '%s' in database \"%s\"; delivery resumes by itself.",
							 EG_VERSION, get_database_name(MyDatabaseId))));
		else if (eg_queue_readiness != EG_READY_UNKNOWN)
			ereport(LOG, (errmsg("eventgrid: extension eventgrid %s is ready; the delivery worker resumes",
								 EG_VERSION)));
		/* statements prepared for other tables must not be reused */
		free_plans();
		eg_queue_readiness = now;
	}
	return now == EG_READY_OK;
}

/*
 * Opens a unit of work (one transaction) reported in pg_stat_activity as
 * activity.  Returns false, with no transaction open, when the extension
 * is not installed in this database or is of another version than the
 * library (eg_queue_readiness says which).
 */
bool
eg_queue_begin(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "eventgrid: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	if (!extension_ready())
	{
		SPI_finish();
		PopActiveSnapshot();
		CommitTransactionCommand();
		return false;
	}
	pgstat_report_activity(STATE_RUNNING, activity);
	return true;
}

/* Commits the unit of work; what SPI allocated in it is freed. */
void
eg_queue_commit(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * Lets the unit of work commit without waiting for the WAL flush: for
 * statements whose loss in a crash only means doing them again.
 */
void
eg_queue_no_flush_wait(void)
{
	run_plan(PLAN_NO_SYNC, NULL, false, SPI_OK_UTILITY);
}

static char *
text_col(SPITupleTable *tt, int row, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

static int32
int32_col(SPITupleTable *tt, int row, int col, int32 dflt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return isnull ? dflt : DatumGetInt32(d);
}

/*
 * Claims up to limit due deliveries whose events add up to about
 * byte_budget bytes (at least one), leasing them to lease_owner for
 * lease_ms, ordered by subscription.  *rows (allocated in the unit of work)
 * stay valid until eg_queue_commit(); event texts are not copied.
 */
int
eg_queue_claim(TimestampTz now, int limit, int64 byte_budget, int lease_owner, int64 lease_ms,
			   EgClaimedRow **rows)
{
	Datum		args[5];
	SPITupleTable *tt;
	int			n;
	EgClaimedRow *out;

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int32GetDatum(limit);
	args[2] = Int32GetDatum(lease_owner);
	args[3] = Int64GetDatum(lease_ms);
	args[4] = Int64GetDatum(Max(byte_budget, 1));
	run_plan(PLAN_CLAIM, args, false, SPI_OK_SELECT);
	n = (int) SPI_processed;
	tt = SPI_tuptable;
	out = palloc0(Max(n, 1) * sizeof(EgClaimedRow));
	for (int i = 0; i < n; i++)
	{
		EgClaimedRow *r = &out[i];
		bool		isnull;
		Datum		v;

		r->id = DatumGetInt64(SPI_getbinval(tt->vals[i], tt->tupdesc, 1, &isnull));
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 2, &isnull);
		r->subscription_id = isnull ? 0 : DatumGetInt64(v);
		r->attempts = int32_col(tt, i, 3, 0);
		r->max_attempts = int32_col(tt, i, 4, 1);
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 5, &isnull);
		r->expired = !isnull && DatumGetBool(v);
		r->endpoint = text_col(tt, i, 6);
		r->subscription_name = text_col(tt, i, 7);
		r->schema = text_col(tt, i, 8);
		r->max_events_per_batch = int32_col(tt, i, 9, 0);
		r->preferred_batch_kb = int32_col(tt, i, 10, 0);
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 11, &isnull);
		if (!isnull)
		{
			text	   *t = DatumGetTextPP(v);

			r->payload.json = VARDATA_ANY(t);
			r->payload.len = VARSIZE_ANY_EXHDR(t);
		}
		r->output_event_id = text_col(tt, i, 12);
		r->data_version = text_col(tt, i, 13);
		r->metadata_version = text_col(tt, i, 14);
		r->custom_headers = text_col(tt, i, 15);
		r->prev_outcome = text_col(tt, i, 16);
		r->prev_http_status = int32_col(tt, i, 17, 0);
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 18, &isnull);
		r->prev_attempted_at = isnull ? 0 : DatumGetTimestampTz(v);
		r->bytes = int32_col(tt, i, 19, 0);
	}
	*rows = out;
	return n;
}

/*
 * Fresh statistics for eventgrid.deliveries.  Queue tables swing between
 * empty and large; after a VACUUM finds one empty the planner believes it
 * empty until the next ANALYZE and picks nested loops that cost the square
 * of the rows per statement (measured: drain rate 18,000 -> 2,700 events/s).
 * Only deliveries: its estimates shape the plans (events are always reached
 * through their primary key), its rows are small, and sampling 30,000 events
 * of up to 1 MB would swell the worker's memory.
 */
void
eg_queue_analyze(void)
{
	if (SPI_execute("ANALYZE eventgrid.deliveries", false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "eventgrid: ANALYZE of eventgrid.deliveries failed");
}

/* Records that the deliveries ids[0..n) are handed to HTTP as wave number wave. */
void
eg_queue_mark_in_flight(int lease_owner, int64 wave, const int64 *ids, int n)
{
	Datum		args[3];

	args[0] = Int32GetDatum(lease_owner);
	args[1] = Int64GetDatum(wave);
	args[2] = int8_array(ids, n);
	run_plan(PLAN_IN_FLIGHT, args, false, SPI_OK_INSERT);
}

/* Forgets the in-flight records of waves whose outcomes are all recorded. */
void
eg_queue_forget_waves(int lease_owner, const int64 *waves, int n)
{
	Datum		args[2];

	if (n == 0)
		return;
	args[0] = Int32GetDatum(lease_owner);
	args[1] = int8_array(waves, n);
	run_plan(PLAN_WAVES_DONE, args, false, SPI_OK_DELETE);
}

/*
 * Writes outcomes back: one set-based statement for retries, deletions,
 * dead letters and counters, one for events that no longer have
 * deliveries.  Takes eventgrid.events before eventgrid.deliveries, the lock
 * order of every writer.  Returns the earliest retry time, or DT_NOEND.
 */
TimestampTz
eg_queue_record(EgOutcome *const *outcomes, int n)
{
	Datum	   *ids = palloc(Max(n, 1) * sizeof(Datum)),
			   *actions = palloc(Max(n, 1) * sizeof(Datum)),
			   *names = palloc(Max(n, 1) * sizeof(Datum)),
			   *statuses = palloc(Max(n, 1) * sizeof(Datum)),
			   *attempted = palloc(Max(n, 1) * sizeof(Datum)),
			   *next_at = palloc(Max(n, 1) * sizeof(Datum)),
			   *reasons = palloc(Max(n, 1) * sizeof(Datum)),
			   *attempts = palloc(Max(n, 1) * sizeof(Datum)),
			   *flags = palloc(Max(n, 1) * sizeof(Datum));
	bool	   *n_name = palloc(Max(n, 1) * sizeof(bool)),
			   *n_status = palloc(Max(n, 1) * sizeof(bool)),
			   *n_attempted = palloc(Max(n, 1) * sizeof(bool)),
			   *n_next = palloc(Max(n, 1) * sizeof(bool)),
			   *n_reason = palloc(Max(n, 1) * sizeof(bool));
	Datum		args[9];
	TimestampTz earliest = DT_NOEND;
	bool		isnull;
	Datum		event_ids;

	run_plan(PLAN_LOCK_EVENTS, NULL, false, SPI_OK_UTILITY);
	if (n == 0)
		return earliest;
	for (int i = 0; i < n; i++)
	{
		const EgOutcome *o = outcomes[i];
		char		a[2] = {o->action, '\0'};

		ids[i] = Int64GetDatum(o->id);
		actions[i] = CStringGetTextDatum(a);
		n_name[i] = o->outcome == NULL;
		names[i] = o->outcome ? CStringGetTextDatum(o->outcome) : (Datum) 0;
		n_status[i] = o->http_status == 0;
		statuses[i] = Int32GetDatum(o->http_status);
		n_attempted[i] = o->attempted_at == 0;
		attempted[i] = TimestampTzGetDatum(o->attempted_at);
		n_next[i] = o->action != 'r';
		next_at[i] = TimestampTzGetDatum(o->next_at);
		n_reason[i] = o->reason == NULL;
		reasons[i] = o->reason ? CStringGetTextDatum(o->reason) : (Datum) 0;
		attempts[i] = Int32GetDatum(o->attempts_after);
		flags[i] = BoolGetDatum(o->attempted);
		if (o->action == 'r' && o->next_at < earliest)
			earliest = o->next_at;
	}
	args[0] = make_array(ids, NULL, n, INT8OID);
	args[1] = make_array(actions, NULL, n, TEXTOID);
	args[2] = make_array(names, n_name, n, TEXTOID);
	args[3] = make_array(statuses, n_status, n, INT4OID);
	args[4] = make_array(attempted, n_attempted, n, TIMESTAMPTZOID);
	args[5] = make_array(next_at, n_next, n, TIMESTAMPTZOID);
	args[6] = make_array(reasons, n_reason, n, TEXTOID);
	args[7] = make_array(attempts, NULL, n, INT4OID);
	args[8] = make_array(flags, NULL, n, BOOLOID);
	run_plan(PLAN_RECORD, args, false, SPI_OK_SELECT);
	event_ids = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		run_plan(PLAN_CLEANUP, &event_ids, false, SPI_OK_DELETE);
	return earliest;
}

/* Earliest next_attempt_at of deliveries lease_owner does not hold, or DT_NOEND. */
TimestampTz
eg_queue_next_due(int lease_owner)
{
	Datum		arg = Int32GetDatum(lease_owner);
	bool		isnull;
	Datum		v;

	run_plan(PLAN_NEXT_DUE, &arg, true, SPI_OK_SELECT);
	v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? DT_NOEND : DatumGetTimestampTz(v);
}

/*
 * Takes back the leases other owners (a crashed run, a restored dump) left:
 * deliveries named in their in-flight records were handed to HTTP and are
 * charged an attempt with outcome Aborted; all are due at now.  Returns how
 * many were charged and how many released.
 */
void
eg_queue_recover(int lease_owner, TimestampTz now, uint64 *charged, uint64 *released)
{
	Datum		args[2];

	args[0] = Int32GetDatum(lease_owner);
	args[1] = TimestampTzGetDatum(now);
	run_plan(PLAN_CHARGE_SENT, args, false, SPI_OK_UPDATE);
	*charged = SPI_processed;
	run_plan(PLAN_RELEASE, args, false, SPI_OK_UPDATE);
	*released = SPI_processed;
	run_plan(PLAN_FORGET_WAVES, args, false, SPI_OK_DELETE);
}
