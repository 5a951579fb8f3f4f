/*
 * worker.c - the delivery worker's main loop: claim -> deliver -> record
 * (SPEC sections 2, 3, 4 and 7).
 *
 * Claim: one statement takes up to a thousand due rows of
 * eventgrid.deliveries with FOR UPDATE SKIP LOCKED, leases them (the lease is
 * next_attempt_at pushed past the response timeout, plus lease_owner; a row
 * with lease_owner set is in flight) and
 * returns each event already converted to its subscription's delivery
 * schema; the transaction then commits, so no transaction stays open across
 * network I/O.  Deliver: rows are grouped by subscription into requests (one
 * event each, or batches when the subscription batches) and sent through
 * libcurl multi, many at once.  Record: finished requests' outcomes go back
 * in one set-based statement per round: retries get their next attempt time,
 * delivered rows are deleted, undeliverable rows are dead-lettered or
 * dropped, counters advance, and events with no delivery left are removed.
 *
 * A worker that dies leaves leased rows behind; on start it releases its own
 * leases (recording the lost attempt as Aborted) so they are retried at once,
 * and any other worker would take them once the lease runs out.
 */
#include "eventgrid.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/formatting.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
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

struct EgClaim;

/* One claimed delivery row and, once decided, its outcome. */
typedef struct EgDelivery
{
	struct EgClaim *claim;
	int64		id;
	int64		subscription_id;	/* 0: the event matched no subscription */
	int32		attempts;		/* attempts made before this claim */
	int32		max_attempts;
	bool		expired;		/* time-to-live ran out before this attempt */
	char	   *endpoint;
	char	   *subscription_name;
	char	   *schema;
	int32		max_events_per_batch;	/* 0: not set */
	int32		preferred_batch_kb; /* 0: not set */
	EgEventPart payload;
	char	   *output_event_id;
	char	   *data_version;
	char	   *metadata_version;
	char	   *headers;		/* custom delivery properties, '\n'-separated */
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

static int	worker_id;
static MemoryContext round_cxt;	/* scratch memory of one loop round */
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr next_due_plan = NULL;
static SPIPlanPtr record_plan = NULL;
static SPIPlanPtr cleanup_plan = NULL;
static SPIPlanPtr release_plan = NULL;
static SPIPlanPtr nosync_plan = NULL;

static EgRequest *pending_head = NULL;
static EgRequest *pending_tail = NULL;
static int	pending_n = 0;
static TimestampTz last_analyze = 0;
static TimestampTz first_unrecorded_at = 0;
static EgDelivery **to_record = NULL;
static int	to_record_n = 0;
static int	to_record_cap = 0;

static const char *claim_sql =
"WITH due AS ("
"  SELECT d.ctid AS tid FROM eventgrid.deliveries d"
"   WHERE d.next_attempt_at <= $1 AND d.lease_owner IS DISTINCT FROM $3"
"   ORDER BY d.next_attempt_at"
"   LIMIT $2"
"   FOR UPDATE SKIP LOCKED"
"), claimed AS ("
"  UPDATE eventgrid.deliveries d"
"     SET next_attempt_at = $1 + $4 * interval '1 millisecond', lease_owner = $3"
"   WHERE d.ctid = ANY (ARRAY(SELECT tid FROM due))"
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
"           AND v.value !~ '[\\r\\n]' AND octet_length(v.value) <= 4096),"
"       c.last_outcome, c.last_http_status, c.last_attempt_at"
"  FROM claimed c"
"  JOIN eventgrid.events e ON e.id = c.event_id"
"  LEFT JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id"
"  LEFT JOIN eventgrid.topics t ON t.name = s.topic"
" ORDER BY c.subscription_id NULLS FIRST, c.id";

static const char *next_due_sql =
"SELECT min(next_attempt_at) FROM eventgrid.deliveries WHERE lease_owner IS DISTINCT FROM $1";

/*
 * One statement records a round: retries get their next attempt, finished
 * rows are deleted and dead-lettered or counted.  d.id = ANY ($1) lets the
 * primary key drive the join with the outcome arrays.
 */
static const char *record_sql =
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
"SELECT array_agg(DISTINCT event_id) FROM finished";

static const char *cleanup_sql =
"DELETE FROM eventgrid.events e WHERE e.id = ANY ($1)"
"   AND NOT EXISTS (SELECT 1 FROM eventgrid.deliveries d WHERE d.event_id = e.id)";

static const char *release_sql =
"UPDATE eventgrid.deliveries"
"   SET attempts = least(attempts + 1, 30), last_outcome = 'Aborted', last_http_status = NULL,"
"       last_attempt_at = $2, next_attempt_at = $2, lease_owner = NULL"
" WHERE lease_owner = $1";

static SPIPlanPtr
prepare(const char *sql, int nargs, Oid *types)
{
	SPIPlanPtr	plan = SPI_prepare(sql, nargs, types);

	if (plan == NULL)
		elog(ERROR, "eventgrid: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	return plan;
}

/*
 * Starts a short transaction for one unit of database work.  Returns false
 * (with no transaction open) when the extension is not installed in this
 * database yet.
 */
static bool
begin_work(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "eventgrid: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	if (!OidIsValid(get_extension_oid("eventgrid", true)))
	{
		SPI_finish();
		PopActiveSnapshot();
		CommitTransactionCommand();
		MemoryContextSwitchTo(round_cxt);
		return false;
	}
	pgstat_report_activity(STATE_RUNNING, activity);
	if (claim_plan == NULL)
	{
		Oid			claim_types[4] = {TIMESTAMPTZOID, INT4OID, INT4OID, INT8OID};
		Oid			due_types[1] = {INT4OID};
		Oid			record_types[9] = {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID,
		TIMESTAMPTZARRAYOID, TIMESTAMPTZARRAYOID, TEXTARRAYOID, INT4ARRAYOID, BOOLARRAYOID};
		Oid			cleanup_types[1] = {INT8ARRAYOID};
		Oid			release_types[2] = {INT4OID, TIMESTAMPTZOID};

		claim_plan = prepare(claim_sql, 4, claim_types);
		next_due_plan = prepare(next_due_sql, 1, due_types);
		record_plan = prepare(record_sql, 9, record_types);
		cleanup_plan = prepare(cleanup_sql, 1, cleanup_types);
		release_plan = prepare(release_sql, 2, release_types);
		nosync_plan = prepare("SET LOCAL synchronous_commit = off", 0, NULL);
	}
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

/* Ends a row without an attempt now (TTL ran out, attempts used up, unmatched). */
static void
finish_without_attempt(EgDelivery *d, char action, const char *reason)
{
	d->action = action;
	d->reason = reason;
	d->attempted = false;
	d->outcome = d->prev_outcome;
	d->http_status = d->prev_http_status;
	d->attempted_at = d->prev_attempted_at;
	d->attempts_after = d->attempts;
	push_record(d);
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

/*
 * Adds "name: value"; libcurl drops a header written with an empty value, so
 * an empty one is written as "name;" which it sends as "name:".
 */
static void
add_header(EgRequest *req, const char *name, const char *value)
{
	char	   *line = value[0] ? psprintf("%s: %s", name, value) : psprintf("%s;", name);

	eg_http_add_header(req, line);
	pfree(line);
}

/* Builds the request carrying rows[0..count) of one subscription. */
static EgRequest *
build_request(EgClaim *claim, EgDelivery **rows, int count, EgEventPart *parts, StringInfo body)
{
	EgDelivery *d = rows[0];
	EgRequest  *req = MemoryContextAllocZero(claim->cxt, sizeof(EgRequest));
	char		count_text[16];

	resetStringInfo(body);
	eg_build_body(body, d->schema, parts, count);
	req->body = malloc(body->len + 1);
	if (req->body == NULL)
		elog(ERROR, "eventgrid: out of memory for a %d-byte request body", body->len);
	memcpy(req->body, body->data, body->len + 1);
	req->body_len = body->len;
	req->items = MemoryContextAlloc(claim->cxt, sizeof(void *) * count);
	memcpy(req->items, rows, sizeof(void *) * count);
	req->count = count;

	/* SPEC 8: content type and the aeg-* headers Event Grid sends */
	add_header(req, "Content-Type", eg_content_type(d->schema, count));
	add_header(req, "aeg-event-type", "Notification");
	add_header(req, "aeg-subscription-name",
			   asc_toupper(d->subscription_name, strlen(d->subscription_name)));
	snprintf(count_text, sizeof(count_text), "%d", d->attempts);
	add_header(req, "aeg-delivery-count", count_text);
	add_header(req, "aeg-metadata-version", d->metadata_version);
	if (strcmp(d->schema, "CloudEventSchemaV1_0") != 0)
		add_header(req, "aeg-data-version", d->data_version);
	add_header(req, "aeg-output-event-id", d->output_event_id);

	/* custom delivery properties: "Name: value" lines */
	if (d->headers)
	{
		char	   *copy = pstrdup(d->headers);
		char	   *save = NULL;

		for (char *h = strtok_r(copy, "\n", &save); h; h = strtok_r(NULL, "\n", &save))
		{
			char	   *sep = strstr(h, ": ");

			if (sep == NULL)
				continue;
			*sep = '\0';
			add_header(req, h, sep + 2);
		}
		pfree(copy);
	}
	return req;
}

/*
 * Claims up to limit due rows and turns them into queued requests.  Returns
 * the number of rows claimed, or -1 when the extension is not installed.
 */
static int
claim(int limit)
{
	Datum		args[4];
	TimestampTz now = eg_now();
	EgClaim    *claim;
	SPITupleTable *tt;
	int			n;
	StringInfoData body;

	if (!begin_work("eventgrid: claiming due deliveries"))
		return -1;
	args[0] = TimestampTzGetDatum(now);
	args[1] = Int32GetDatum(limit);
	args[2] = Int32GetDatum(worker_id);
	args[3] = Int64GetDatum((int64) eg_response_timeout_ms + EG_LEASE_MARGIN_MS);
	if (SPI_execute_plan(claim_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "eventgrid: claim failed");
	n = (int) SPI_processed;
	if (n == 0)
	{
		end_work();
		return 0;
	}

	claim = MemoryContextAllocZero(TopMemoryContext, sizeof(EgClaim));
	claim->cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid claim", ALLOCSET_DEFAULT_SIZES);
	claim->rows = MemoryContextAllocZero(claim->cxt, n * sizeof(EgDelivery));
	claim->unrecorded = n;
	tt = SPI_tuptable;
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
		d->endpoint = copy_text(tt, i, 6, claim->cxt);
		d->subscription_name = copy_text(tt, i, 7, claim->cxt);
		d->schema = copy_text(tt, i, 8, claim->cxt);
		d->max_events_per_batch = get_int32(tt, i, 9, 0);
		d->preferred_batch_kb = get_int32(tt, i, 10, 0);
		d->payload.json = copy_text(tt, i, 11, claim->cxt);
		d->payload.len = d->payload.json ? strlen(d->payload.json) : 0;
		d->output_event_id = copy_text(tt, i, 12, claim->cxt);
		d->data_version = copy_text(tt, i, 13, claim->cxt);
		d->metadata_version = copy_text(tt, i, 14, claim->cxt);
		d->headers = copy_text(tt, i, 15, claim->cxt);
		d->prev_outcome = copy_text(tt, i, 16, claim->cxt);
		d->prev_http_status = get_int32(tt, i, 17, 0);
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 18, &isnull);
		d->prev_attempted_at = isnull ? 0 : DatumGetTimestampTz(v);
	}
	end_work();

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

	/* Group rows of one subscription (the claim is ordered by it) into requests. */
	initStringInfo(&body);
	for (int i = 0; i < n;)
	{
		int			j = i;
		int			nsend = 0;
		EgDelivery **send;
		EgEventPart *parts;

		while (j < n && claim->rows[j].subscription_id == claim->rows[i].subscription_id)
			j++;
		send = palloc(sizeof(EgDelivery *) * (j - i));
		parts = palloc(sizeof(EgEventPart) * (j - i));
		for (int k = i; k < j; k++)
		{
			EgDelivery *d = &claim->rows[k];

			if (d->subscription_id == 0)
				finish_without_attempt(d, 'u', NULL);
			else if (d->expired)
				finish_without_attempt(d, 'f', "TimeToLiveExceeded");
			else if (d->attempts >= d->max_attempts)
				finish_without_attempt(d, 'f', "MaxDeliveryAttemptsExceeded");
			else
			{
				send[nsend] = d;
				parts[nsend++] = d->payload;
			}
		}
		if (nsend > 0)
		{
			EgDelivery *first = send[0];
			bool		batching = first->max_events_per_batch > 0 || first->preferred_batch_kb > 0;
			int			max_events = 1;
			int64		max_bytes = 0;

			if (batching)
			{
				max_events = first->max_events_per_batch > 0
					? first->max_events_per_batch : eg_default_max_events_per_batch;
				max_bytes = (int64) 1024 * (first->preferred_batch_kb > 0
											? first->preferred_batch_kb : eg_default_preferred_batch_kb);
			}
			for (int k = 0; k < nsend;)
			{
				int			take = eg_batch_take(&parts[k], nsend - k, max_events, max_bytes);

				queue_request(build_request(claim, &send[k], take, &parts[k], &body));
				k += take;
			}
		}
		pfree(send);
		pfree(parts);
		i = j;
	}
	pfree(body.data);
	return n;
}

static void
release_claim_row(EgDelivery *d)
{
	EgClaim    *claim = d->claim;

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

/*
 * Writes every decided row back in one transaction: one set-based statement
 * for retries, deletions, dead letters and counters, one for events that no
 * longer have deliveries.  Returns the earliest retry time recorded, or
 * DT_NOEND.
 */
static TimestampTz
record(void)
{
	int			n = to_record_n;
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
		goto release;			/* extension dropped: nothing to record into */

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

	/*
	 * Outcomes need not wait for the WAL flush: one lost in a crash leaves
	 * its row leased, so it is retried (and the attempt counted) after
	 * restart, which at-least-once delivery allows.  Claims stay durable so
	 * that interrupted attempts are always counted.
	 */
	if (SPI_execute_plan(nosync_plan, NULL, NULL, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "eventgrid: SET LOCAL synchronous_commit failed");
	if (SPI_execute_plan(record_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "eventgrid: recording outcomes failed");
	event_ids = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
	{
		if (SPI_execute_plan(cleanup_plan, &event_ids, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "eventgrid: removing delivered events failed");
	}
	end_work();

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
	Datum		arg = Int32GetDatum(worker_id);
	bool		isnull;
	Datum		v;
	TimestampTz result = DT_NOEND;

	if (!begin_work("eventgrid: looking up the next due delivery"))
		return DT_NOEND;
	if (SPI_execute_plan(next_due_plan, &arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "eventgrid: next due lookup failed");
	v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		result = DatumGetTimestampTz(v);
	end_work();
	return result;
}

/* Releases leases a previous incarnation of this worker left behind. */
static bool
release_own_leases(void)
{
	Datum		args[2];

	if (!begin_work("eventgrid: releasing leases of an interrupted run"))
		return false;
	args[0] = Int32GetDatum(worker_id);
	args[1] = TimestampTzGetDatum(eg_now());
	if (SPI_execute_plan(release_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "eventgrid: releasing leases failed");
	if (SPI_processed > 0)
		ereport(LOG,
				(errmsg("eventgrid: %llu deliveries in flight when the worker stopped will be retried",
						(unsigned long long) SPI_processed)));
	end_work();
	return true;
}

static void
start_pending(void)
{
	while (pending_head && eg_http_in_flight() < eg_max_concurrent_requests)
	{
		EgRequest  *req = pending_head;

		pending_head = req->next;
		if (pending_head == NULL)
			pending_tail = NULL;
		pending_n--;
		req->started_at = eg_now();
		eg_http_start(req, ((EgDelivery *) req->items[0])->endpoint, eg_response_timeout_ms);
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

/* Background worker entry point, registered in _PG_init(). */
void
eventgrid_worker_main(Datum arg)
{
	TimestampTz next_claim_at = 0;
	bool		leases_released = false;

	worker_id = DatumGetInt32(arg);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(eg_database_name, NULL, 0);
	pgstat_report_appname("eventgrid delivery worker");

	/*
	 * Queue tables swing between empty and large.  After a VACUUM finds one
	 * empty, the planner takes it for empty until the next ANALYZE and the
	 * cached plans scan every page of it on each statement (measured: drain
	 * rate 18,000 -> 2,800 events/s after a steady run), or bitmap-scan and
	 * sort every due row to take the first thousand, so that each claim
	 * costs the whole backlog.  Every statement of this worker has a plain
	 * index path, so sequential and bitmap scans are ruled out here.
	 */
	SetConfigOption("enable_seqscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_bitmapscan", "off", PGC_SUSET, PGC_S_OVERRIDE);

	SpinLockAcquire(&eg_shared->mutex);
	eg_shared->worker_latch = MyLatch;
	eg_shared->worker_pid = MyProcPid;
	SpinLockRelease(&eg_shared->mutex);
	eg_http_init();
	before_shmem_exit(detach_latch, (Datum) 0);

	ereport(LOG, (errmsg("eventgrid delivery worker started in database \"%s\"", eg_database_name)));
	round_cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid round", ALLOCSET_DEFAULT_SIZES);

	for (;;)
	{
		TimestampTz now;
		bool		idle;

		MemoryContextSwitchTo(round_cxt);
		MemoryContextReset(round_cxt);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			next_claim_at = 0;
		}

		now = eg_now();
		if (!leases_released && now >= next_claim_at)
		{
			leases_released = release_own_leases();
			if (!leases_released)
				next_claim_at = now + (TimestampTz) 10 * USECS_PER_SEC;
		}
		/*
		 * Claim in large sets while fewer requests wait than can be in
		 * flight, so HTTP never runs dry and each statement's fixed cost is
		 * spread over many rows.  This worker never claims its own leased
		 * rows again, however long they wait in the queue.
		 */
		if (leases_released && !eg_delivery_paused &&
			pending_n < eg_max_concurrent_requests && now >= next_claim_at)
		{
			int			limit = EG_CLAIM_MAX_ROWS;
			int			n = claim(limit);

			if (n < 0)
				next_claim_at = now + (TimestampTz) 10 * USECS_PER_SEC;
			else if (n < limit)
				next_claim_at = next_due();
			else
				next_claim_at = now;
		}
		start_pending();

		/* wait for HTTP only when there is no claiming to do meanwhile */
		if (eg_http_in_flight() > 0 &&
			(eg_delivery_paused || pending_n >= eg_max_concurrent_requests || eg_now() < next_claim_at))
			eg_http_wait(EG_BUSY_POLL_MS);
		collect_finished();

		/*
		 * Record outcomes in sets of hundreds; a smaller set waits at most a
		 * few milliseconds, or not at all once nothing is in flight.
		 */
		if (to_record_n >= EG_RECORD_MIN_ROWS ||
			(to_record_n > 0 &&
			 ((eg_http_in_flight() == 0 && pending_head == NULL) ||
			  GetCurrentTimestamp() - first_unrecorded_at >= EG_RECORD_MAX_DELAY_MS * 1000)))
		{
			TimestampTz earliest = record();

			if (earliest < next_claim_at)
				next_claim_at = earliest;
		}

		idle = eg_http_in_flight() == 0 && pending_head == NULL;
		if (idle)
		{
			long		timeout_ms;
			int			rc;

			now = eg_now();
			timeout_ms = next_claim_at <= now ? 0
				: (long) Min((next_claim_at - now + 999) / 1000, (TimestampTz) EG_IDLE_MAX_SLEEP_MS);
			if (eg_delivery_paused)
				timeout_ms = EG_IDLE_MAX_SLEEP_MS;	/* a reload (SIGHUP) sets the latch */
			if (timeout_ms > 0)
			{
				rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							   timeout_ms, PG_WAIT_EXTENSION);
				ResetLatch(MyLatch);
				if (rc & WL_LATCH_SET)
					next_claim_at = 0;
			}
		}
		else if (MyLatch->is_set)
		{
			ResetLatch(MyLatch);
			next_claim_at = 0;
		}
	}
}
