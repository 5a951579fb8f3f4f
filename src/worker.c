/*
 * worker.c - the delivery worker's main loop: claim -> deliver -> record
 * (SPEC sections 2, 3, 4 and 7).
 *
 * Claim: one statement takes up to a thousand due rows of
 * eventgrid.deliveries with FOR UPDATE SKIP LOCKED, as many as fit in what
 * eventgrid.max_bytes_in_flight leaves, leases them (next_attempt_at pushed
 * past the response timeout, lease_owner set to this worker's pid) and
 * returns each event converted to its subscription's delivery schema; the
 * requests are built from that result and the transaction commits before
 * any network I/O.  Deliver: before requests are handed to HTTP, one row of
 * eventgrid.requests_in_flight records which deliveries they carry; then
 * libcurl sends them, many at once.  Record: outcomes go back in one
 * set-based statement per round: retries get their next attempt time,
 * delivered rows are deleted, undeliverable rows are dead-lettered or
 * dropped, counters advance, and events with no delivery left are removed.
 *
 * Crashes: a new worker takes back the leases a previous one left, charging
 * an attempt (outcome Aborted) only to deliveries named in
 * requests_in_flight, the ones that really went to HTTP.
 *
 * Errors: any ERROR in a unit of database work aborts that unit only; what
 * HTTP is doing and the outcomes decided but not yet recorded stay in
 * memory, and the unit is tried again after a pause that grows to 10 s.
 * The error is logged once, not at every try.  SIGINT (pg_cancel_backend)
 * cancels the statement running, nothing more.
 *
 * The worker sets for itself every setting its work depends on (search_path,
 * read-only and isolation defaults, timeouts), so that neither the
 * database's nor the role's defaults can change what its statements mean or
 * make them fail.
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
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/pmsignal.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"
#if PG_VERSION_NUM >= 150000
#include "common/pg_prng.h"
#endif

#define EG_CLAIM_MAX_ROWS 1000
#define EG_RECORD_MIN_ROWS 500
#define EG_RECORD_MAX_DELAY_MS 20
#define EG_IDLE_MAX_SLEEP_MS 60000
#define EG_BUSY_POLL_MS 5
#define EG_LEASE_MARGIN_MS 60000
#define EG_ANALYZE_INTERVAL_MS 60000
#define EG_LOCKED_DUE_RETRY_MS 250	/* due rows exist, but another session locks them */
#define EG_NOT_READY_RETRY_MS 10000 /* extension missing, or of another version */
#define EG_ERROR_BACKOFF_MIN_MS 100
#define EG_ERROR_BACKOFF_MAX_MS 10000
#define EG_LOCK_TIMEOUT "10s"

struct EgClaim;

/* Deliveries handed to HTTP together, recorded as one row of requests_in_flight. */
typedef struct EgWave
{
	int64		no;
	int			remaining;		/* its deliveries not yet recorded */
} EgWave;

/* One claimed delivery row and, once decided, its outcome. */
typedef struct EgDelivery
{
	struct EgClaim *claim;
	int64		id;
	int64		subscription_id;	/* 0: the event matched no subscription */
	int32		attempts;		/* attempts made before this claim */
	int32		max_attempts;
	bool		expired;		/* time-to-live ran out before this attempt */
	int64		bytes;			/* event size, counted against max_bytes_in_flight */
	EgWave	   *wave;			/* set once handed to HTTP */
	char	   *prev_outcome;	/* outcome of the previous attempt, if any */
	int32		prev_http_status;
	TimestampTz prev_attempted_at;	/* 0: none */
	/* decision */
	char		action;			/* d delivered, r retry, f final failure, u unmatched */
	const char *outcome;		/* last outcome; NULL if never attempted */
	int32		http_status;	/* 0: none */
	bool		attempted;		/* an attempt was made in this round */
	int32		attempts_after;
	TimestampTz attempted_at;
	TimestampTz next_at;
	const char *reason;			/* dead-letter reason when action is f */
} EgDelivery;

typedef struct EgClaim
{
	MemoryContext cxt;
	EgDelivery *rows;
	int			unrecorded;
} EgClaim;

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
		"       (SELECT string_agg(p.header || ': ' || v.value, E'\\n')"
		"          FROM eventgrid.delivery_properties p"
		"          CROSS JOIN LATERAL (SELECT CASE"
		"               WHEN p.source_field IS NULL THEN p.value"
		"               WHEN jsonb_typeof(e.event #> string_to_array(p.source_field, '.')) IN ('string', 'number', 'boolean')"
		"               THEN e.event #>> string_to_array(p.source_field, '.') END AS value) v"
		"         WHERE p.subscription_id = s.id AND v.value IS NOT NULL"
		"           AND v.value !~ '[\\x01-\\x1f\\x7f]' AND octet_length(v.value) <= 4096),"
		"       c.last_outcome, c.last_http_status, c.last_attempt_at,"
		"       coalesce(e.event_bytes, 0)"
		"  FROM claimed c"
		"  LEFT JOIN eventgrid.events e ON e.id = c.event_id"
		"  LEFT JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id AND e.id IS NOT NULL"
		"  LEFT JOIN eventgrid.topics t ON t.name = s.topic"
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

static void forget_done_waves(void);

static int	lease_owner;		/* this worker's pid */
static MemoryContext round_cxt; /* scratch memory of one loop round */

static EgRequest *pending_head = NULL;
static EgRequest *pending_tail = NULL;
static int	pending_n = 0;
static TimestampTz last_analyze = 0;
static TimestampTz first_unrecorded_at = 0;
static EgDelivery **to_record = NULL;
static int	to_record_n = 0;
static int	to_record_cap = 0;
static int64 bytes_held = 0;	/* event bytes claimed and not yet recorded */
static int64 next_wave_no = 1;
static int64 *waves_done = NULL;	/* recorded waves whose marker rows can go */
static int	waves_done_n = 0;
static int	waves_done_cap = 0;

/* a claim being turned into requests; freed if its transaction fails */
static EgClaim *claim_in_progress = NULL;
static EgRequest *built_head = NULL;

/* error recovery */
static char *last_error = NULL;
static int	error_streak = 0;
static long error_backoff_ms = 0;
static TimestampTz db_retry_at = 0; /* no database work before this */

/* readiness of the extension in this database */
typedef enum EgReadiness
{
	EG_READY_UNKNOWN,
	EG_READY_OK,
	EG_READY_MISSING,
	EG_READY_VERSION
} EgReadiness;
static EgReadiness readiness = EG_READY_UNKNOWN;

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
		elog(ERROR, "eventgrid: worker statement %d failed: %s", (int) id, SPI_result_code_string(rc));
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
 * for?  Logs each change of the answer once.  A library and schema of
 * different versions would run statements against tables they were not
 * written for: the worker idles until ALTER EXTENSION eventgrid UPDATE.
 */
static bool
extension_ready(void)
{
	char	   *version = installed_version();
	EgReadiness now = version == NULL ? EG_READY_MISSING
		: strcmp(version, EG_VERSION) != 0 ? EG_READY_VERSION : EG_READY_OK;

	if (now != readiness)
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
		else if (readiness != EG_READY_UNKNOWN)
			ereport(LOG, (errmsg("eventgrid: extension eventgrid %s is ready; the delivery worker resumes",
								 EG_VERSION)));
		/* statements prepared for other tables must not be reused */
		free_plans();
		readiness = now;
	}
	return now == EG_READY_OK;
}

/*
 * Starts a short transaction for one unit of database work.  Returns false
 * (with no transaction open) when the extension is not installed in this
 * database, or is of another version than the library.
 */
static bool
begin_work(const char *activity)
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
		MemoryContextSwitchTo(round_cxt);
		db_retry_at = GetCurrentTimestamp() + (TimestampTz) EG_NOT_READY_RETRY_MS * 1000;
		return false;
	}
	pgstat_report_activity(STATE_RUNNING, activity);
	return true;
}

static void
end_work(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(round_cxt);
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	if (error_streak > 0)
		ereport(LOG,
				(errmsg("eventgrid: the delivery worker's database work succeeds again after %d failed tries",
						error_streak)));
	error_streak = 0;
	error_backoff_ms = 0;
	if (last_error)
		pfree(last_error);
	last_error = NULL;
}

static void
push_record(EgDelivery *d)
{
	if (to_record_n == 0)
		first_unrecorded_at = GetCurrentTimestamp();
	if (to_record_n == to_record_cap)
	{
		to_record_cap = Max(64, to_record_cap * 2);
		to_record = to_record == NULL
			? MemoryContextAlloc(TopMemoryContext, to_record_cap * sizeof(EgDelivery *))
			: repalloc(to_record, to_record_cap * sizeof(EgDelivery *));
	}
	to_record[to_record_n++] = d;
}

static double
random_fraction(void)
{
#if PG_VERSION_NUM >= 150000
	return pg_prng_double(&pg_global_prng_state);
#else
	return (double) random() / ((double) MAX_RANDOM_VALUE + 1);
#endif
}

/*
 * Decides what happens to one row after an attempt (SPEC 3, 4 and 7): the
 * attempt number advances; success is final; a no-retry status or the last
 * allowed attempt ends the delivery; otherwise the next attempt waits the
 * scheduled delay plus 0..eventgrid.retry_jitter_percent of it.
 */
static void
decide(EgDelivery *d, EgTransport transport, int http_status, TimestampTz started, TimestampTz now)
{
	EgVerdict	verdict = eg_verdict(transport, http_status);

	d->attempts_after = d->attempts + 1;
	d->attempted = true;
	d->outcome = eg_outcome_name(transport, http_status);
	d->http_status = transport == EG_TRANSPORT_OK ? http_status : 0;
	d->attempted_at = started;
	if (verdict == EG_VERDICT_DELIVERED)
		d->action = 'd';
	else if (verdict == EG_VERDICT_NO_RETRY)
	{
		d->action = 'f';
		d->reason = "NonRetriableError";
	}
	else if (d->attempts_after >= d->max_attempts)
	{
		d->action = 'f';
		d->reason = "MaxDeliveryAttemptsExceeded";
	}
	else
	{
		int64		delay_ms = eg_retry_delay_ms(d->attempts_after, d->http_status);

		delay_ms += (int64) (delay_ms * (eg_retry_jitter_percent / 100.0) * random_fraction());
		d->action = 'r';
		d->next_at = now + delay_ms * 1000;
	}
	push_record(d);
}

/*
 * Ends a row without an attempt now: TTL ran out, attempts used up,
 * unmatched, or (reason NonRetriableError with outcome InvalidHeader) a
 * request that may not be sent.  Recorded once the claim commits.
 */
static void
finish_without_attempt(EgDelivery *d, char action, const char *reason, const char *outcome)
{
	d->action = action;
	d->reason = reason;
	d->attempted = false;
	d->outcome = outcome ? outcome : d->prev_outcome;
	d->http_status = outcome ? 0 : d->prev_http_status;
	d->attempted_at = outcome ? eg_now() : d->prev_attempted_at;
	d->attempts_after = d->attempts;
}

static char *
copy_text(SPITupleTable *tt, int row, int col, MemoryContext cxt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);
	MemoryContext old;
	char	   *s;

	if (isnull)
		return NULL;
	old = MemoryContextSwitchTo(cxt);
	s = TextDatumGetCString(d);
	MemoryContextSwitchTo(old);
	return s;
}

static int32
get_int32(SPITupleTable *tt, int row, int col, int32 dflt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return isnull ? dflt : DatumGetInt32(d);
}

static void
queue_request(EgRequest *req)
{
	req->next = NULL;
	if (pending_tail)
		pending_tail->next = req;
	else
		pending_head = req;
	pending_tail = req;
	pending_n++;
}

/* Frees requests that were built but will never be started. */
static void
free_built_requests(void)
{
	while (built_head)
	{
		EgRequest  *next = built_head->next;

		eg_http_free_headers(built_head);
		free(built_head->body);
		built_head->body = NULL;
		built_head = next;
	}
}

/*
 * The rows of one subscription, claim rows [from, to), become requests:
 * rows that cannot be attempted are finished at once; the others go in
 * batches (or one by one) built straight from the claim's result, whose
 * texts are not copied again.
 */
static void
build_requests(EgClaim *claim, SPITupleTable *tt, int from, int to, StringInfo scratch)
{
	EgDelivery **send = palloc(sizeof(EgDelivery *) * (to - from));
	EgEventPart *parts = palloc(sizeof(EgEventPart) * (to - from));
	int		   *rowno = palloc(sizeof(int) * (to - from));
	int			nsend = 0;
	int			max_events = 1;
	int64		max_bytes = 0;
	int32		batch_events = get_int32(tt, from, 9, 0);
	int32		batch_kb = get_int32(tt, from, 10, 0);

	for (int k = from; k < to; k++)
	{
		EgDelivery *d = &claim->rows[k];
		bool		isnull;
		Datum		v;

		if (d->subscription_id == 0)
			finish_without_attempt(d, 'u', NULL, NULL);
		else if (d->expired)
			finish_without_attempt(d, 'f', "TimeToLiveExceeded", NULL);
		else if (d->attempts >= d->max_attempts)
			finish_without_attempt(d, 'f', "MaxDeliveryAttemptsExceeded", NULL);
		else
		{
			text	   *t;

			v = SPI_getbinval(tt->vals[k], tt->tupdesc, 11, &isnull);
			if (isnull)
			{
				/* its event is gone (deleted by hand): nothing to deliver or count */
				finish_without_attempt(d, 'u', NULL, NULL);
				continue;
			}
			t = DatumGetTextPP(v);
			parts[nsend].json = VARDATA_ANY(t);
			parts[nsend].len = VARSIZE_ANY_EXHDR(t);
			rowno[nsend] = k;
			send[nsend++] = d;
		}
	}
	if (batch_events > 0 || batch_kb > 0)
	{
		max_events = batch_events > 0 ? batch_events : eg_default_max_events_per_batch;
		max_bytes = (int64) 1024 * (batch_kb > 0 ? batch_kb : eg_default_preferred_batch_kb);
	}
	for (int k = 0; k < nsend;)
	{
		int			take = eg_batch_take(&parts[k], nsend - k, max_events, max_bytes);
		int			r = rowno[k];
		EgRequest  *req = MemoryContextAllocZero(claim->cxt, sizeof(EgRequest));
		EgRequestSpec spec;

		spec.schema = TextDatumGetCString(SPI_getbinval(tt->vals[r], tt->tupdesc, 8, &(bool){0}));
		spec.subscription_name = copy_text(tt, r, 7, CurrentMemoryContext);
		spec.delivery_count = send[k]->attempts;
		spec.output_event_id = copy_text(tt, r, 12, CurrentMemoryContext);
		spec.data_version = copy_text(tt, r, 13, CurrentMemoryContext);
		spec.metadata_version = copy_text(tt, r, 14, CurrentMemoryContext);
		spec.custom_headers = copy_text(tt, r, 15, CurrentMemoryContext);
		if (eg_request_build(req, &spec, &parts[k], take, scratch))
		{
			req->url = copy_text(tt, r, 6, claim->cxt);
			req->items = MemoryContextAlloc(claim->cxt, sizeof(void *) * take);
			memcpy(req->items, &send[k], sizeof(void *) * take);
			req->count = take;
			req->next = built_head;
			built_head = req;
		}
		else
		{
			/* second line of defence: a header line an event would corrupt */
			for (int j = k; j < k + take; j++)
				finish_without_attempt(send[j], 'f', "NonRetriableError", "InvalidHeader");
			ereport(LOG,
					(errmsg("eventgrid: a delivery request of event subscription \"%s\" was not sent: a header value holds a control character",
							spec.subscription_name),
					 errdetail("%d events were dead-lettered or dropped with outcome InvalidHeader.", take)));
		}
		k += take;
	}
	pfree(send);
	pfree(parts);
	pfree(rowno);
}

/*
 * Claims due rows, within what eventgrid.max_bytes_in_flight leaves, and
 * turns them into queued requests.  Returns the number of rows claimed, or
 * -1 when the extension is not ready.
 */
static int
claim(int limit, int64 byte_budget)
{
	Datum		args[5];
	TimestampTz now = eg_now();
	EgClaim    *claim;
	SPITupleTable *tt;
	int			n;
	StringInfoData scratch;

	if (!begin_work("eventgrid: claiming due deliveries"))
		return -1;
	args[0] = TimestampTzGetDatum(now);
	args[1] = Int32GetDatum(limit);
	args[2] = Int32GetDatum(lease_owner);
	args[3] = Int64GetDatum((int64) eg_response_timeout_ms + EG_LEASE_MARGIN_MS);
	args[4] = Int64GetDatum(Max(byte_budget, 1));
	/*
	 * A claim lost in a crash only means its rows are claimed again (none of
	 * them was sent before a later, durable requests_in_flight row): no need
	 * to wait for the flush.
	 */
	run_plan(PLAN_NO_SYNC, NULL, false, SPI_OK_UTILITY);
	run_plan(PLAN_CLAIM, args, false, SPI_OK_SELECT);
	n = (int) SPI_processed;
	tt = SPI_tuptable;

	/*
	 * Markers of recorded waves go in the same transaction: a delivery
	 * claimed again must not be named by an old marker once this commits.
	 */
	forget_done_waves();
	if (n == 0)
	{
		end_work();
		waves_done_n = 0;
		return 0;
	}

	claim = MemoryContextAllocZero(TopMemoryContext, sizeof(EgClaim));
	claim->cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid claim", ALLOCSET_DEFAULT_SIZES);
	claim->rows = MemoryContextAllocZero(claim->cxt, n * sizeof(EgDelivery));
	claim->unrecorded = n;
	claim_in_progress = claim;
	for (int i = 0; i < n; i++)
	{
		EgDelivery *d = &claim->rows[i];
		bool		isnull;
		Datum		v;

		d->claim = claim;
		d->id = DatumGetInt64(SPI_getbinval(tt->vals[i], tt->tupdesc, 1, &isnull));
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 2, &isnull);
		d->subscription_id = isnull ? 0 : DatumGetInt64(v);
		d->attempts = get_int32(tt, i, 3, 0);
		d->max_attempts = get_int32(tt, i, 4, 1);
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 5, &isnull);
		d->expired = !isnull && DatumGetBool(v);
		d->prev_outcome = copy_text(tt, i, 16, claim->cxt);
		d->prev_http_status = get_int32(tt, i, 17, 0);
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 18, &isnull);
		d->prev_attempted_at = isnull ? 0 : DatumGetTimestampTz(v);
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 19, &isnull);
		d->bytes = isnull ? 0 : DatumGetInt32(v);
	}

	/* rows of one subscription (the claim is ordered by it) become requests */
	initStringInfo(&scratch);
	for (int i = 0; i < n;)
	{
		int			j = i;

		while (j < n && claim->rows[j].subscription_id == claim->rows[i].subscription_id)
			j++;
		build_requests(claim, tt, i, j, &scratch);
		i = j;
	}
	pfree(scratch.data);
	end_work();
	waves_done_n = 0;

	/* committed: the requests may go, and rows finished without an attempt are recorded */
	while (built_head)
	{
		EgRequest  *req = built_head;

		built_head = req->next;
		queue_request(req);
	}
	for (int i = 0; i < n; i++)
	{
		bytes_held += claim->rows[i].bytes;
		if (claim->rows[i].action != 0)
			push_record(&claim->rows[i]);
	}
	claim_in_progress = NULL;

	/*
	 * A full claim means a backlog.  The queue tables swing between empty
	 * and large; after a VACUUM finds one empty the planner believes it
	 * empty until the next ANALYZE and picks nested loops that cost the
	 * square of the rows per statement (measured: drain rate 18,000 -> 2,700
	 * events/s).  So a backlog gets fresh statistics, at most once a minute.
	 */
	if (n == limit && GetCurrentTimestamp() - last_analyze >= EG_ANALYZE_INTERVAL_MS * 1000)
	{
		last_analyze = GetCurrentTimestamp();
		if (begin_work("eventgrid: analyzing eventgrid.deliveries"))
		{
			/*
			 * deliveries only: its estimates shape the plans (events are
			 * always reached through their primary key), its rows are small,
			 * and sampling 30,000 events of up to 1 MB would swell the
			 * worker's memory.
			 */
			if (SPI_execute("ANALYZE eventgrid.deliveries", false, 0) != SPI_OK_UTILITY)
				elog(ERROR, "eventgrid: ANALYZE of eventgrid.deliveries failed");
			end_work();
		}
	}
	return n;
}

static void
release_claim_row(EgDelivery *d)
{
	EgClaim    *claim = d->claim;

	bytes_held -= d->bytes;
	if (d->wave && --d->wave->remaining == 0)
	{
		if (waves_done_n == waves_done_cap)
		{
			waves_done_cap = Max(16, waves_done_cap * 2);
			waves_done = waves_done == NULL
				? MemoryContextAlloc(TopMemoryContext, waves_done_cap * sizeof(int64))
				: repalloc(waves_done, waves_done_cap * sizeof(int64));
		}
		waves_done[waves_done_n++] = d->wave->no;
		pfree(d->wave);
	}
	d->wave = NULL;
	if (--claim->unrecorded == 0)
	{
		MemoryContextDelete(claim->cxt);
		pfree(claim);
	}
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

/* In a unit of work: deletes the requests_in_flight rows of recorded waves. */
static void
forget_done_waves(void)
{
	Datum		args[2];
	Datum	   *nos;

	if (waves_done_n == 0)
		return;
	nos = palloc(waves_done_n * sizeof(Datum));
	for (int i = 0; i < waves_done_n; i++)
		nos[i] = Int64GetDatum(waves_done[i]);
	args[0] = Int32GetDatum(lease_owner);
	args[1] = make_array(nos, NULL, waves_done_n, INT8OID);
	run_plan(PLAN_WAVES_DONE, args, false, SPI_OK_DELETE);
}

/*
 * Writes every decided row back in one transaction: one set-based statement
 * for retries, deletions, dead letters and counters, one for events that no
 * longer have deliveries.  Returns the earliest retry time recorded, or
 * DT_NOEND.  On an ERROR nothing is lost: the rows stay decided in memory
 * and the next call writes them.
 */
static TimestampTz
record(void)
{
	int			n = to_record_n;
	int			nwaves = waves_done_n;
	Datum	   *ids,
			   *actions,
			   *outcomes,
			   *statuses,
			   *attempted,
			   *next_at,
			   *reasons,
			   *attempts,
			   *attempted_flags;
	bool	   *n_outcome,
			   *n_status,
			   *n_attempted,
			   *n_next,
			   *n_reason;
	Datum		args[9];
	TimestampTz earliest = DT_NOEND;
	bool		isnull;
	Datum		event_ids;

	/* the arrays live in the SPI procedure context, freed by SPI_finish */
	if (!begin_work("eventgrid: recording delivery outcomes"))
	{
		/* extension dropped: nothing to record into */
		if (readiness == EG_READY_MISSING)
			goto release;
		return DT_NOEND;
	}

	ids = palloc(n * sizeof(Datum));
	actions = palloc(n * sizeof(Datum));
	outcomes = palloc(n * sizeof(Datum));
	statuses = palloc(n * sizeof(Datum));
	attempted = palloc(n * sizeof(Datum));
	next_at = palloc(n * sizeof(Datum));
	reasons = palloc(n * sizeof(Datum));
	attempts = palloc(n * sizeof(Datum));
	attempted_flags = palloc(n * sizeof(Datum));
	n_outcome = palloc(n * sizeof(bool));
	n_status = palloc(n * sizeof(bool));
	n_attempted = palloc(n * sizeof(bool));
	n_next = palloc(n * sizeof(bool));
	n_reason = palloc(n * sizeof(bool));
	for (int i = 0; i < n; i++)
	{
		EgDelivery *d = to_record[i];
		char		a[2] = {d->action, '\0'};

		ids[i] = Int64GetDatum(d->id);
		actions[i] = CStringGetTextDatum(a);
		n_outcome[i] = d->outcome == NULL;
		outcomes[i] = d->outcome ? CStringGetTextDatum(d->outcome) : (Datum) 0;
		n_status[i] = d->http_status == 0;
		statuses[i] = Int32GetDatum(d->http_status);
		n_attempted[i] = d->attempted_at == 0;
		attempted[i] = TimestampTzGetDatum(d->attempted_at);
		n_next[i] = d->action != 'r';
		next_at[i] = TimestampTzGetDatum(d->next_at);
		n_reason[i] = d->reason == NULL;
		reasons[i] = d->reason ? CStringGetTextDatum(d->reason) : (Datum) 0;
		attempts[i] = Int32GetDatum(d->attempts_after);
		attempted_flags[i] = BoolGetDatum(d->attempted);
		if (d->action == 'r' && d->next_at < earliest)
			earliest = d->next_at;
	}
	args[0] = make_array(ids, NULL, n, INT8OID);
	args[1] = make_array(actions, NULL, n, TEXTOID);
	args[2] = make_array(outcomes, n_outcome, n, TEXTOID);
	args[3] = make_array(statuses, n_status, n, INT4OID);
	args[4] = make_array(attempted, n_attempted, n, TIMESTAMPTZOID);
	args[5] = make_array(next_at, n_next, n, TIMESTAMPTZOID);
	args[6] = make_array(reasons, n_reason, n, TEXTOID);
	args[7] = make_array(attempts, NULL, n, INT4OID);
	args[8] = make_array(attempted_flags, NULL, n, BOOLOID);

	run_plan(PLAN_LOCK_EVENTS, NULL, false, SPI_OK_UTILITY);

	/*
	 * Outcomes need not wait for the WAL flush: one lost in a crash leaves
	 * its row leased and named in requests_in_flight, so after restart it is
	 * charged as Aborted and retried, which at-least-once delivery allows.
	 */
	run_plan(PLAN_NO_SYNC, NULL, false, SPI_OK_UTILITY);
	if (n > 0)
	{
		run_plan(PLAN_RECORD, args, false, SPI_OK_SELECT);
		event_ids = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (!isnull)
			run_plan(PLAN_CLEANUP, &event_ids, false, SPI_OK_DELETE);
	}
	forget_done_waves();
	end_work();

	/* waves recorded before this call are gone from requests_in_flight */
	memmove(waves_done, waves_done + nwaves, (waves_done_n - nwaves) * sizeof(int64));
	waves_done_n -= nwaves;
release:
	for (int i = 0; i < n; i++)
		release_claim_row(to_record[i]);
	to_record_n = 0;
	return earliest;
}

/* Earliest next_attempt_at of rows this worker does not hold, or DT_NOEND. */
static TimestampTz
next_due(void)
{
	Datum		arg = Int32GetDatum(lease_owner);
	bool		isnull;
	Datum		v;
	TimestampTz result = DT_NOEND;

	if (!begin_work("eventgrid: looking up the next due delivery"))
		return DT_NOEND;
	run_plan(PLAN_NEXT_DUE, &arg, true, SPI_OK_SELECT);
	v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		result = DatumGetTimestampTz(v);
	end_work();
	return result;
}

/*
 * Takes back the leases a previous run of the worker left (a crash, or a
 * restored dump): deliveries that were handed to HTTP are charged an attempt
 * with outcome Aborted, the others are not, and all are due at once.
 */
static bool
release_old_leases(void)
{
	Datum		args[2];
	uint64		charged;
	uint64		released;

	if (!begin_work("eventgrid: releasing leases of an interrupted run"))
		return false;
	args[0] = Int32GetDatum(lease_owner);
	args[1] = TimestampTzGetDatum(eg_now());
	run_plan(PLAN_CHARGE_SENT, args, false, SPI_OK_UPDATE);
	charged = SPI_processed;
	run_plan(PLAN_RELEASE, args, false, SPI_OK_UPDATE);
	released = SPI_processed;
	run_plan(PLAN_FORGET_WAVES, args, false, SPI_OK_DELETE);
	if (released > 0)
		ereport(LOG,
				(errmsg("eventgrid: %llu deliveries in flight when the worker stopped will be retried",
						(unsigned long long) released),
				 errdetail("%llu of them had been sent and are counted as attempts with outcome Aborted.",
						   (unsigned long long) charged)));
	end_work();
	return true;
}

/*
 * Hands queued requests to HTTP as slots free up.  Before they go, one row
 * of requests_in_flight names their deliveries, committed durably, so that
 * after a crash exactly these are charged an attempt: requests still queued
 * in memory were never sent and are not charged.
 */
static void
start_pending(void)
{
	int			room = eg_max_concurrent_requests - eg_http_in_flight();
	int			nreq = 0;
	int			nrows = 0;
	Datum	   *ids;
	Datum		args[3];
	EgWave	   *wave;
	EgRequest  *req;

	for (req = pending_head; req && nreq < room; req = req->next)
	{
		nreq++;
		nrows += req->count;
	}
	if (nreq == 0)
		return;

	if (!begin_work("eventgrid: recording requests in flight"))
		return;
	ids = palloc(nrows * sizeof(Datum));
	nrows = 0;
	req = pending_head;
	for (int i = 0; i < nreq; i++, req = req->next)
		for (int k = 0; k < req->count; k++)
			ids[nrows++] = Int64GetDatum(((EgDelivery *) req->items[k])->id);
	args[0] = Int32GetDatum(lease_owner);
	args[1] = Int64GetDatum(next_wave_no);
	args[2] = make_array(ids, NULL, nrows, INT8OID);
	run_plan(PLAN_IN_FLIGHT, args, false, SPI_OK_INSERT);
	forget_done_waves();
	end_work();
	waves_done_n = 0;

	wave = MemoryContextAlloc(TopMemoryContext, sizeof(EgWave));
	wave->no = next_wave_no++;
	wave->remaining = nrows;
	for (int i = 0; i < nreq; i++)
	{
		req = pending_head;
		pending_head = req->next;
		if (pending_head == NULL)
			pending_tail = NULL;
		pending_n--;
		for (int k = 0; k < req->count; k++)
			((EgDelivery *) req->items[k])->wave = wave;
		req->started_at = eg_now();
		eg_http_start(req, req->url, eg_response_timeout_ms);
	}
}

static void
collect_finished(void)
{
	EgRequest  *req;
	TimestampTz now = eg_now();

	while ((req = eg_http_take_finished()) != NULL)
	{
		if (req->transport != EG_TRANSPORT_OK)
			ereport(DEBUG1,
					(errmsg("eventgrid: delivery request to \"%s\" failed: %s", req->url,
							req->errbuf[0] ? req->errbuf : eg_outcome_name(req->transport, 0))));
		for (int k = 0; k < req->count; k++)
			decide((EgDelivery *) req->items[k], req->transport, req->http_status,
				   req->started_at, now);
	}
}

static void
detach_latch(int code, Datum arg)
{
	SpinLockAcquire(&eg_shared->mutex);
	eg_shared->worker_latch = NULL;
	eg_shared->worker_pid = 0;
	SpinLockRelease(&eg_shared->mutex);
	eg_http_shutdown();
}

/*
 * Settings the worker's statements depend on, set here so that database
 * and role defaults (ALTER DATABASE ... SET, ALTER ROLE ... SET) cannot
 * change them: a search_path with only pg_catalog and pg_temp (last), so no
 * function or operator anyone created can run in place of the built-in one;
 * writable READ COMMITTED transactions; no statement or idle timeout; a
 * lock timeout of its own, so a lock held elsewhere delays the worker's
 * work without stopping HTTP.
 *
 * Plans: queue tables swing between empty and large.  After a VACUUM finds
 * one empty, the planner takes it for empty until the next ANALYZE and the
 * cached plans scan every page of it on each statement (measured: drain
 * rate 18,000 -> 2,800 events/s after a steady run), or bitmap-scan and
 * sort every due row to take the first thousand, so that each claim costs
 * the whole backlog.  Every statement of this worker has a plain index
 * path, so sequential and bitmap scans are ruled out here.
 */
static void
pin_settings(void)
{
	static const char *const settings[][2] = {
		{"search_path", "pg_catalog, pg_temp"},
		{"default_transaction_read_only", "off"},
		{"default_transaction_isolation", "read committed"},
		{"default_transaction_deferrable", "off"},
		{"session_replication_role", "origin"},
		{"statement_timeout", "0"},
		{"idle_in_transaction_session_timeout", "0"},
		{"lock_timeout", EG_LOCK_TIMEOUT},
		{"synchronous_commit", "on"},
		{"jit", "off"},
		{"enable_seqscan", "off"},
		{"enable_bitmapscan", "off"},
	};

	for (int i = 0; i < (int) lengthof(settings); i++)
		SetConfigOption(settings[i][0], settings[i][1], PGC_SUSET, PGC_S_OVERRIDE);
}

/*
 * Error recovery, entered through longjmp from any ERROR in the loop: the
 * failed unit of work is rolled back and the loop goes on.  Requests in
 * HTTP and outcomes decided but not recorded are untouched; a claim that
 * was being turned into requests is dropped (its leases rolled back with
 * it).  The error is logged the first time; the same error again is not.
 */
static void
recover_from_error(void)
{
	ErrorData  *edata;
	bool		repeated;

	error_context_stack = NULL;
	HOLD_INTERRUPTS();
	disable_all_timeouts(false);
	QueryCancelPending = false;

	MemoryContextSwitchTo(TopMemoryContext);
	edata = CopyErrorData();
	repeated = last_error != NULL && edata->message != NULL && strcmp(last_error, edata->message) == 0;
	if (!repeated)
	{
		EmitErrorReport();
		if (last_error)
			pfree(last_error);
		last_error = pstrdup(edata->message ? edata->message : "");
	}
	FreeErrorData(edata);
	FlushErrorState();

	AbortCurrentTransaction();
	if (claim_in_progress)
	{
		free_built_requests();
		MemoryContextDelete(claim_in_progress->cxt);
		pfree(claim_in_progress);
		claim_in_progress = NULL;
	}
	pgstat_report_activity(STATE_IDLE, NULL);

	error_streak++;
	error_backoff_ms = Min(Max(error_backoff_ms * 2, EG_ERROR_BACKOFF_MIN_MS), EG_ERROR_BACKOFF_MAX_MS);
	db_retry_at = GetCurrentTimestamp() + (TimestampTz) error_backoff_ms * 1000;
	if (!repeated)
		ereport(LOG,
				(errmsg("eventgrid: the delivery worker will try that again in %ld ms; requests in flight and recorded outcomes are kept",
						error_backoff_ms)));
	MemoryContextSwitchTo(round_cxt);
	RESUME_INTERRUPTS();
}

/* Background worker entry point, started by the launcher for the database dboid. */
void
eventgrid_worker_main(Datum arg)
{
	sigjmp_buf	local_sigjmp_buf;
	volatile TimestampTz next_claim_at = 0;
	volatile bool leases_released = false;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	pqsignal(SIGINT, StatementCancelHandler);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(arg), InvalidOid, 0);
	pgstat_report_appname("eventgrid delivery worker");
	pin_settings();
	lease_owner = MyProcPid;

	SpinLockAcquire(&eg_shared->mutex);
	eg_shared->worker_latch = MyLatch;
	eg_shared->worker_pid = MyProcPid;
	SpinLockRelease(&eg_shared->mutex);
	eg_http_init();
	before_shmem_exit(detach_latch, (Datum) 0);

	ereport(LOG, (errmsg("eventgrid delivery worker started in database \"%s\"", eg_database_name)));
	round_cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid round", ALLOCSET_DEFAULT_SIZES);

	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
		recover_from_error();
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
		TimestampTz now;
		bool		db_ok;
		bool		want_claim;
		int64		byte_limit = (int64) eg_max_bytes_in_flight_kb * 1024;

		MemoryContextSwitchTo(round_cxt);
		MemoryContextReset(round_cxt);
		CHECK_FOR_INTERRUPTS();
		if (!PostmasterIsAlive())
			proc_exit(1);
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			pin_settings();
			eg_http_set_max_connections(eg_max_concurrent_requests);
			next_claim_at = 0;
		}

		now = eg_now();
		db_ok = GetCurrentTimestamp() >= db_retry_at;
		if (db_ok && !leases_released)
		{
			leases_released = release_old_leases();
			db_ok = leases_released;
		}

		/*
		 * Claim in large sets while fewer requests wait than can be in
		 * flight, so HTTP never runs dry and each statement's fixed cost is
		 * spread over many rows.  Event bytes held stay under
		 * eventgrid.max_bytes_in_flight: a claim's result and the requests
		 * built from it both exist for a moment, so a claim takes at most
		 * half of what is left (and at least one event when nothing is held).
		 */
		want_claim = db_ok && leases_released && !eg_delivery_paused &&
			pending_n < eg_max_concurrent_requests && now >= next_claim_at &&
			(bytes_held == 0 || bytes_held < byte_limit / 2);
		if (want_claim)
		{
			int			limit = EG_CLAIM_MAX_ROWS;
			int			n = claim(limit, (byte_limit - bytes_held) / 2);

			if (n < 0)
				next_claim_at = 0;	/* db_retry_at holds it back */
			else if (n < limit)
			{
				next_claim_at = next_due();

				/*
				 * Due rows the claim did not get are locked by another
				 * session (SKIP LOCKED passed them by): look again a little
				 * later, not in a busy loop.
				 */
				if (next_claim_at <= now)
					next_claim_at = now + (TimestampTz) EG_LOCKED_DUE_RETRY_MS * 1000;
			}
			else
				next_claim_at = now;
		}
		if (pending_head && GetCurrentTimestamp() >= db_retry_at)
			start_pending();

		/* wait for HTTP only when there is no claiming to do meanwhile */
		if (eg_http_in_flight() > 0 && !want_claim)
			eg_http_wait(EG_BUSY_POLL_MS);
		collect_finished();

		/*
		 * Record outcomes in sets of hundreds; a smaller set waits at most a
		 * few milliseconds, or not at all once nothing is in flight.
		 */
		if (GetCurrentTimestamp() >= db_retry_at &&
			(to_record_n >= EG_RECORD_MIN_ROWS ||
			 (to_record_n > 0 &&
			  ((eg_http_in_flight() == 0 && pending_head == NULL) ||
			   GetCurrentTimestamp() - first_unrecorded_at >= EG_RECORD_MAX_DELAY_MS * 1000))))
		{
			TimestampTz earliest = record();

			if (earliest < next_claim_at)
				next_claim_at = earliest;
		}

		if (eg_http_in_flight() == 0)
		{
			long		timeout_ms;
			TimestampTz wake_at = next_claim_at;

			now = eg_now();
			if (eg_delivery_paused && pending_head == NULL && to_record_n == 0)
				wake_at = DT_NOEND; /* a reload (SIGHUP) sets the latch */
			if (pending_head || to_record_n > 0 || !leases_released)
				wake_at = Min(wake_at, now);
			if (GetCurrentTimestamp() < db_retry_at)
				wake_at = Max(wake_at, now + (db_retry_at - GetCurrentTimestamp()));
			timeout_ms = wake_at <= now ? 0
				: (long) Min((wake_at - now + 999) / 1000, (TimestampTz) EG_IDLE_MAX_SLEEP_MS);
			if (timeout_ms > 0)
			{
				int			rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
										   timeout_ms, PG_WAIT_EXTENSION);

				ResetLatch(MyLatch);
				if (rc & WL_LATCH_SET)
				{
					next_claim_at = 0;
					/* a publish: the extension may just have been created or updated */
					if (readiness != EG_READY_OK && error_streak == 0)
						db_retry_at = 0;
				}
			}
		}
		else if (MyLatch->is_set)
		{
			ResetLatch(MyLatch);
			next_claim_at = 0;
		}
	}
}
