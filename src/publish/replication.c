/*
 * replication.c - events that PostgreSQL's logical replication brings from
 * another server (README "Scaling out").
 *
 * The application's server publishes eventgrid.events (INSERT only,
 * through the partitioned table); a delivery server subscribes to it.  Its
 * apply worker runs with session_replication_role = replica, so the
 * ordinary triggers of eventgrid.events (validation, the wake-up at commit)
 * do not fire there.  eventgrid._apply_event(), a BEFORE INSERT row trigger
 * enabled for replica sessions only, takes each applied row over instead:
 *
 * - txid becomes this server's transaction id: the delivery workers'
 *   positions are snapshots of this server's transactions, and a sent
 *   transaction id means nothing here;
 * - id comes from this server's sequence, so that events of several
 *   publishing servers never collide; the sent id (if the publication sends
 *   it) is kept in source_event_id, and source names the subscription;
 * - the row must be an event a publish here would take (publish.c's
 *   checks, in a subtransaction: the topic's schema, no control characters
 *   in the fields sent as headers, at most 1 MB); one that is not is kept
 *   apart in eventgrid.rejected_events and skipped, never an apply error;
 * - the event is stamped as a publish stamps it and event_bytes made here
 *   whatever was sent; publish_time is stamped when not sent;
 * - an event for a topic this database lacks is counted in
 *   eventgrid.unknown_topic_events and kept (never an apply error, which
 *   would stop replication);
 * - each applied transaction wakes the delivery workers when it commits,
 *   and is counted in eventgrid.replication_progress (for the lag), which
 *   is written at most once a second (with the transactions counted since).
 *
 * The event_table column, if sent, routes the row to that event table; the
 * rotation empties a table only when no position needs its rows, under a
 * lock no writer holds, so a row landing in any of them is safe.
 */
#include "core/eventgrid.h"
#include "publish/publish.h"
#include "store/store.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "replication/worker_internal.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

/* Is this process a logical replication apply or table synchronization worker? */
static bool
in_logical_replication_worker(void)
{
	return MyLogicalRepWorker != NULL && MySubscription != NULL;
}

/*
 * eventgrid.events_id_seq's OID, kept for the backend's life (every
 * published row's id default asks for it, and the table change trigger for
 * each event it stores) and forgotten when the relation cache drops it
 * (DROP EXTENSION, ALTER SEQUENCE).
 */
static Oid	id_sequence = InvalidOid;
static bool id_sequence_callback = false;

static void
forget_id_sequence(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == id_sequence)
		id_sequence = InvalidOid;
}

Oid
eg_event_id_sequence(void)
{
	if (!OidIsValid(id_sequence))
	{
		if (!id_sequence_callback)
		{
			CacheRegisterRelcacheCallback(forget_id_sequence, (Datum) 0);
			id_sequence_callback = true;
		}
		id_sequence = eg_store_table("events_id_seq");
	}
	return id_sequence;
}

PG_FUNCTION_INFO_V1(eventgrid_new_event_id);

/*
 * SQL: eventgrid._new_event_id(), the default of events.id:
 * nextval('eventgrid.events_id_seq') (with its privilege check), or NULL
 * in a logical replication worker, where it tells eventgrid._apply_event()
 * that the publication did not send an id.
 */
Datum
eventgrid_new_event_id(PG_FUNCTION_ARGS)
{
	if (in_logical_replication_worker())
		PG_RETURN_NULL();
	PG_RETURN_INT64(nextval_internal(eg_event_id_sequence(), true));
}

/*
 * Topics found to exist (a handful), forgotten every second: a topic
 * dropped meanwhile is still counted as known for up to a second (only
 * eventgrid.unknown_topic_events depends on it, not what is delivered).
 */
#define KNOWN_TOPICS 16
#define FORGET_MS 1000
static TimestampTz known_since = 0;
static char *known_topics[KNOWN_TOPICS];
static int	known_n;
static SPIPlanPtr unknown_plan;
static SPIPlanPtr progress_plan;
static SPIPlanPtr reject_plan;
static bool rejected_logged = false;

/* The transaction the last applied row belonged to (each counted once). */
static LocalTransactionId noted_lxid = InvalidLocalTransactionId;
/* Applied transactions not yet written to eventgrid.replication_progress, and when it last was. */
static int64 unwritten_transactions = 0;
static TimestampTz progress_written_at = 0;

static SPIPlanPtr
prepare_kept(const char *sql, int nargs, Oid *types)
{
	SPIPlanPtr	plan = SPI_prepare(sql, nargs, types);

	if (plan == NULL)
		elog(ERROR, "eventgrid: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	return plan;
}

/* Connects to SPI the first time a row's work needs it. */
static void
need_spi(bool *connected)
{
	if (*connected)
		return;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "eventgrid: SPI_connect failed");
	*connected = true;
}

/* Does this database have topic (a known topic looked up again after a second)? */
static bool
topic_exists(const char *topic)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	if (now - known_since >= FORGET_MS * 1000 || now < known_since)
	{
		for (int i = 0; i < known_n; i++)
			pfree(known_topics[i]);
		known_n = 0;
		known_since = now;
	}
	for (int i = 0; i < known_n; i++)
		if (strcmp(known_topics[i], topic) == 0)
			return true;

	if (!eg_topic_exists(topic))
		return false;
	if (known_n < KNOWN_TOPICS)
		known_topics[known_n++] = MemoryContextStrdup(TopMemoryContext, topic);
	return true;
}

/*
 * Counts an applied event for a topic this database lacks (one whose name
 * no topic could have under "(not a topic name)": it comes from another
 * server, and an unbounded key would fail the apply).
 */
static void
count_unknown_topic(const char *source, const char *topic, bool *connected)
{
	Datum		args[2];

	need_spi(connected);
	if (unknown_plan == NULL)
	{
		Oid			types[2] = {TEXTOID, TEXTOID};

		unknown_plan = prepare_kept(
									"INSERT INTO eventgrid.unknown_topic_events AS u (source, topic, events)"
									" VALUES ($1, CASE WHEN eventgrid._is_topic_name($2) THEN $2"
									"                  ELSE '(not a topic name)' END, 1)"
									" ON CONFLICT (source, topic) DO UPDATE"
									" SET events = u.events OPERATOR(pg_catalog.+) 1, last_at = pg_catalog.now()",
									2, types);
	}
	args[0] = CStringGetTextDatum(source);
	args[1] = CStringGetTextDatum(topic);
	if (SPI_execute_plan(unknown_plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "eventgrid: counting an event of an unknown topic failed");
}

/*
 * Keeps an applied row that is not a valid event apart, in
 * eventgrid.rejected_events, with the reason a publish would have given
 * (event NULL when the row had none); the first of this process's life is
 * logged (naming the subscription only: the rest comes from the other
 * server).
 */
static void
reject_event(const char *source, Datum source_event_id, bool no_id, const char *topic, Datum event,
			 bool no_event, const char *reason, bool *connected)
{
	Datum		args[5];
	bool		nulls_[5] = {false, no_id, topic == NULL, no_event, false};
	char		nulls[5];

	need_spi(connected);
	if (reject_plan == NULL)
	{
		Oid			types[5] = {TEXTOID, INT8OID, TEXTOID, JSONBOID, TEXTOID};

		reject_plan = prepare_kept(
								   "INSERT INTO eventgrid.rejected_events (source, source_event_id, topic, event, reason)"
								   " VALUES ($1, $2, $3, $4, $5)",
								   5, types);
	}
	args[0] = CStringGetTextDatum(source);
	args[1] = source_event_id;
	args[2] = topic == NULL ? (Datum) 0 : CStringGetTextDatum(topic);
	args[3] = event;
	args[4] = CStringGetTextDatum(reason);
	for (int i = 0; i < 5; i++)
		nulls[i] = nulls_[i] ? 'n' : ' ';
	if (SPI_execute_plan(reject_plan, args, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "eventgrid: keeping a rejected event failed");
	if (!rejected_logged)
	{
		rejected_logged = true;
		ereport(LOG,
				(errmsg("eventgrid: logical replication subscription \"%s\" brought a row that is not a valid event; it was kept apart",
						source),
				 errdetail("Rows a publish would have refused are not delivered; replication goes on."),
				 errhint("See eventgrid.rejected_events (this is logged once per apply worker).")));
	}
}

/*
 * Counts the applied transaction once; at most once a second, writes the
 * count so far with this transaction's first event's publish time.
 */
static void
note_progress(const char *source, TimestampTz publish_time, bool *connected)
{
	Datum		args[4];
	TimestampTz now;

	if (noted_lxid == eg_current_lxid())
		return;
	noted_lxid = eg_current_lxid();
	unwritten_transactions++;
	now = GetCurrentTimestamp();
	if (now - progress_written_at < FORGET_MS * 1000 && now >= progress_written_at)
		return;
	need_spi(connected);
	if (progress_plan == NULL)
	{
		Oid			types[4] = {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID};

		progress_plan = prepare_kept(
									 "INSERT INTO eventgrid.replication_progress AS p"
									 "       (source, transactions, last_publish_time, last_applied_at)"
									 " VALUES ($1, $4, $2, $3)"
									 " ON CONFLICT (source) DO UPDATE"
									 " SET transactions = p.transactions OPERATOR(pg_catalog.+) $4,"
									 "     last_publish_time = $2, last_applied_at = $3",
									 4, types);
	}
	args[0] = CStringGetTextDatum(source);
	args[1] = TimestampTzGetDatum(publish_time);
	args[2] = TimestampTzGetDatum(now);
	args[3] = Int64GetDatum(unwritten_transactions);
	if (SPI_execute_plan(progress_plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "eventgrid: noting replication progress failed");
	/* counted as written; if this transaction aborts, its count is lost with it (a gauge's detail) */
	unwritten_transactions = 0;
	progress_written_at = now;
}

PG_FUNCTION_INFO_V1(eventgrid_apply_event);

/*
 * Trigger function eventgrid._apply_event(): BEFORE INSERT FOR EACH ROW on
 * eventgrid.events, ENABLE REPLICA.  See the file's comment.
 */
Datum
eventgrid_apply_event(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	tupdesc;
	HeapTuple	tuple;
	const char *source;
	int			cols[8];
	Datum		values[8];
	bool		nulls[8] = {false, false, false, false, false, false, false, false};
	int			n = 0;
	bool		isnull;
	Datum		d;
	char	   *topic;
	TimestampTz publish_time;
	bool		connected = false;
	bool		known;
	Datum		sent_id;
	bool		no_sent_id;
	Datum		event;
	bool		no_event;
	Jsonb	   *stored = NULL;
	char	   *domain_topic = NULL;
	int64		size = 0;
	char	   *reason;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) || !TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("eventgrid._apply_event() must be called as a BEFORE INSERT FOR EACH ROW trigger")));

	tupdesc = trigdata->tg_relation->rd_att;
	tuple = trigdata->tg_trigtuple;

	/* other replica sessions (a restore, a tool) store rows as they are */
	if (!in_logical_replication_worker())
		return PointerGetDatum(tuple);
	source = MySubscription->name;

	/* the sent id is the publishing server's; this server numbers its own */
	sent_id = SPI_getbinval(tuple, tupdesc, SPI_fnumber(tupdesc, "id"), &no_sent_id);

	/* the row is an event as a publish here would take it, or it is kept apart */
	d = SPI_getbinval(tuple, tupdesc, SPI_fnumber(tupdesc, "topic"), &isnull);
	topic = isnull ? NULL : TextDatumGetCString(d);
	event = SPI_getbinval(tuple, tupdesc, SPI_fnumber(tupdesc, "event"), &no_event);
	known = topic != NULL && topic_exists(topic);
	if (topic == NULL)
		reason = "topic of a published event must not be NULL";
	else if (no_event)
		reason = psprintf("event published to topic \"%s\" must not be NULL", topic);
	else
		reason = eg_check_replicated_event(topic, known, DatumGetJsonbP(event), &stored, &domain_topic, &size);
	if (reason != NULL)
	{
		reject_event(source, sent_id, no_sent_id, topic, event, no_event, reason, &connected);
		SPI_finish();
		return PointerGetDatum(NULL);
	}

	cols[n] = SPI_fnumber(tupdesc, "source_event_id");
	values[n] = sent_id;
	nulls[n++] = no_sent_id;
	cols[n] = SPI_fnumber(tupdesc, "id");
	values[n++] = Int64GetDatum(nextval_internal(eg_event_id_sequence(), false));
	cols[n] = SPI_fnumber(tupdesc, "txid");
	values[n++] = FullTransactionIdGetDatum(GetTopFullTransactionId());
	cols[n] = SPI_fnumber(tupdesc, "source");
	values[n++] = CStringGetTextDatum(source);
	/* stamped as a publish stamps it, its size made here whatever was sent */
	cols[n] = SPI_fnumber(tupdesc, "event");
	values[n++] = JsonbPGetDatum(stored);
	cols[n] = SPI_fnumber(tupdesc, "event_bytes");
	values[n++] = Int32GetDatum((int32) size);
	/* routed within a domain (SPEC 18) as a publish here would route it */
	if ((cols[n] = SPI_fnumber(tupdesc, "domain_topic")) > 0)
	{
		values[n] = domain_topic ? CStringGetTextDatum(domain_topic) : (Datum) 0;
		nulls[n++] = domain_topic == NULL;
	}

	d = SPI_getbinval(tuple, tupdesc, SPI_fnumber(tupdesc, "publish_time"), &isnull);
	if (isnull)
	{
		publish_time = eg_transaction_now();
		cols[n] = SPI_fnumber(tupdesc, "publish_time");
		values[n++] = TimestampTzGetDatum(publish_time);
	}
	else
		publish_time = DatumGetTimestampTz(d);

	if (!known)
		count_unknown_topic(source, topic, &connected);
	note_progress(source, publish_time, &connected);
	if (connected)
		SPI_finish();

	eg_wake_for_events_at_commit();
	return PointerGetDatum(heap_modify_tuple_by_cols(tuple, tupdesc, n, cols, values, nulls));
}
