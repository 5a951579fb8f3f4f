/*
 * wal_source_worker.c - a WAL source's background worker (SPEC 19): one
 * per source, "eventgrid WAL source <name> [<database>]", started by the
 * upkeep worker (eg_wal_sources_start()) for each source that is not
 * paused and has none; it holds an advisory lock for its whole life, so
 * that there is never a second one.
 *
 * It connects to the source with libpq's replication connection
 * (replication=database), creates the slot if missing (pgoutput; for a
 * backfill inside a repeatable read transaction that keeps the slot's
 * snapshot, in which wal_source_backfill.c then reads the tables), and
 * streams from where the source's replication origin here says its
 * events were last committed (START_REPLICATION ... (proto_version '1',
 * publication_names ..., messages 'true')).  Each XLogData message's
 * pgoutput content goes to wal_source_decode.c; a keepalive that asks
 * for one, and every 10 s, is answered with the source position whose
 * events are durable here (local commits are asynchronous, as the apply
 * worker's: a position is reported once its commit here is flushed).
 * Any error: the connection is closed, the state is "failing" with the
 * message, and it tries again after 1 s, doubling to 30 s; a slot gone
 * after the source was read from it is such an error (a new one would
 * skip what the source wrote meanwhile).
 * pause_wal_source() and drop_wal_source() stop it (SIGTERM).
 */
#include "publish/wal_source.h"
#include "store/store.h"
#include "store/worker.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "libpq-fe.h"
#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/origin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/pg_lsn.h"
#include "utils/snapmgr.h"

#define EG_WAL_FEEDBACK_MS 10000	/* standby status updates at least this often */
#define EG_WAL_STATUS_MS 1000		/* the source's WAL end written to wal_source_status at most this often */
#define EG_WAL_BACKOFF_MIN_MS 1000
#define EG_WAL_BACKOFF_MAX_MS 30000

PGDLLEXPORT void eventgrid_wal_source_main(Datum arg);

static PGconn *conn = NULL;
static MemoryContext source_cxt = NULL;

/*
 * Source positions done with here, in the order read, each with the end of
 * the local commit that must be flushed before the source may be told (as
 * PostgreSQL's apply worker keeps its lsn_mapping): this worker commits
 * asynchronously, and the WAL writer flushes within wal_writer_delay.  A
 * position that needed no commit here has local InvalidXLogRecPtr: it is
 * told once the marks before it are.
 */
typedef struct EgFlushMark
{
	XLogRecPtr	remote;
	XLogRecPtr	local;
} EgFlushMark;
static EgFlushMark *marks = NULL;
static int	nmarks = 0;
static int	maxmarks = 0;

void
eg_wal_origin_name(int64 id, char *buf)
{
	snprintf(buf, EG_WAL_ORIGIN_NAME_LEN, "eventgrid_wal_source_" INT64_FORMAT, id);
}

static EgStatement definition_stmt = {
	.name = "WAL source definition",
	.sql =
	"SELECT d.name, d.connection, d.publication, d.slot_name, d.message_prefix, d.paused, d.owner_role"
	"  FROM eventgrid.wal_source_definitions d WHERE d.id = $1"
	/* behind a drop or pause in progress: a worker started meanwhile then finds it gone or paused */
	"   FOR SHARE",
	.nargs = 1,
	.types = {INT8OID},
};

static EgStatement status_stmt = {
	.name = "WAL source state",
	.sql =
	/* (a source restored by pg_restore has no status row yet: made here) */
	"INSERT INTO eventgrid.wal_source_status AS s (source_id, state, source_lsn, last_error, last_error_time, confirmed_lsn)"
	" VALUES ($1, $2, $3, $4, CASE WHEN $4 IS NULL THEN NULL ELSE now() END, $5)"
	" ON CONFLICT (source_id) DO UPDATE SET state = $2, updated_at = now(),"
	"       source_lsn = coalesce($3, s.source_lsn), confirmed_lsn = coalesce($5, s.confirmed_lsn),"
	"       last_error = CASE WHEN $4 IS NULL THEN s.last_error ELSE $4 END,"
	"       last_error_time = CASE WHEN $4 IS NULL THEN s.last_error_time ELSE now() END",
	.nargs = 5,
	.types = {INT8OID, TEXTOID, PG_LSNOID, TEXTOID, PG_LSNOID},
};

static EgStatement starting_stmt = {
	.name = "WAL sources without a worker",
	.sql =
	"SELECT d.id, d.name FROM eventgrid.wal_source_definitions d"
	" WHERE NOT d.paused AND NOT EXISTS ("
	"   SELECT 1 FROM pg_catalog.pg_locks l"
	"    WHERE l.locktype = 'advisory' AND l.database = $1 AND l.classid = $2"
	"      AND l.objid = (d.id % 4294967296)::pg_catalog.oid AND l.objsubid = 2)"
	" ORDER BY d.id",
	.nargs = 2,
	.types = {OIDOID, OIDOID},
};

/*
 * Writes the source's state (and the source's WAL end, an error, the
 * position done with here: InvalidXLogRecPtr or NULL for none) in a
 * transaction of its own.
 */
static void
set_status(int64 id, const char *state, XLogRecPtr source_lsn, const char *error, XLogRecPtr confirmed)
{
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	args[0] = Int64GetDatum(id);
	args[1] = CStringGetTextDatum(state);
	args[2] = LSNGetDatum(source_lsn);
	if (XLogRecPtrIsInvalid(source_lsn))
		nulls[2] = 'n';
	args[3] = error ? CStringGetTextDatum(error) : (Datum) 0;
	if (error == NULL)
		nulls[3] = 'n';
	args[4] = LSNGetDatum(confirmed);
	if (XLogRecPtrIsInvalid(confirmed))
		nulls[4] = 'n';
	eg_wal_begin("eventgrid: writing a WAL source's state");
	eg_store_run_nulls(&status_stmt, args, nulls, SPI_OK_INSERT);
	eg_store_commit();
}

/* See wal_source.h. */
void
eg_wal_begin(const char *activity)
{
	if (eg_store_begin(activity))
		return;
	/* the upkeep worker starts it again once the extension is there, in this library's version */
	ereport(LOG, (errmsg("eventgrid: a WAL source worker of database \"%s\" leaves: the extension is not ready there",
						 get_database_name(MyDatabaseId))));
	proc_exit(0);
}

/* Waits for the source's socket (and the latch: interrupts are served). */
static void
wait_socket(int io_flag, long timeout_ms)
{
	int			rc = WaitLatchOrSocket(MyLatch, WL_LATCH_SET | WL_EXIT_ON_PM_DEATH | io_flag |
									   (timeout_ms >= 0 ? WL_TIMEOUT : 0),
									   PQsocket(conn), timeout_ms, PG_WAIT_EXTENSION);

	if (rc & WL_LATCH_SET)
	{
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

static void
source_error(EgWalSource *src, const char *what)
{
	ereport(ERROR, (errcode(ERRCODE_CONNECTION_FAILURE),
					errmsg("eventgrid: WAL source \"%s\": %s: %s", src->name, what,
						   pchomp(PQerrorMessage(conn)))));
}

/*
 * Connects to the source (libpq's replication connection, interruptible);
 * for an owner that is not a superuser, only with a password used.
 */
static void
source_connect(EgWalSource *src, const char *conninfo, bool owner_superuser)
{
	/* values in the forms this server's input functions read, whatever the source's defaults (as PostgreSQL's apply worker) */
	const char *keys[] = {"dbname", "replication", "fallback_application_name", "options", NULL};
	const char *vals[] = {conninfo, "database", "eventgrid",
	"-c datestyle=ISO -c intervalstyle=postgres -c extra_float_digits=3", NULL};
	PostgresPollingStatusType status = PGRES_POLLING_WRITING;

	conn = PQconnectStartParams(keys, vals, 1);
	if (conn == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	if (PQstatus(conn) != CONNECTION_BAD)
		do
		{
			wait_socket(status == PGRES_POLLING_READING ? WL_SOCKET_READABLE : WL_SOCKET_WRITEABLE, -1);
			status = PQconnectPoll(conn);
		} while (status != PGRES_POLLING_OK && status != PGRES_POLLING_FAILED);
	if (PQstatus(conn) != CONNECTION_OK)
		ereport(ERROR, (errcode(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION),
						errmsg("eventgrid: WAL source \"%s\": could not connect to the source: %s", src->name,
							   pchomp(PQerrorMessage(conn))),
						errhint("Check the connection string (eventgrid.wal_sources shows it without its password), "
								"the source's pg_hba.conf and that its role has REPLICATION.")));
	if (!owner_superuser && !PQconnectionUsedPassword(conn))
		ereport(ERROR, (errcode(ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION),
						errmsg("eventgrid: WAL source \"%s\": the source did not ask for the password", src->name),
						errdetail("The source was created by a role that is not a superuser: its connection must authenticate with a password."),
						errhint("Use password authentication on the source (scram-sha-256), as postgres_fdw requires.")));
	if (PQserverVersion(conn) < 140000)
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						errmsg("eventgrid: WAL source \"%s\": the source runs PostgreSQL %d; WAL sources need 14 or later",
							   src->name, PQserverVersion(conn) / 10000)));
}

/* See wal_source.h. */
PGresult *
eg_wal_source_exec(EgWalSource *src, const char *sql, ExecStatusType expected)
{
	PGresult   *last = NULL;

	if (!PQsendQuery(conn, sql))
		source_error(src, "could not send a command");
	for (;;)
	{
		PGresult   *r;

		while (PQisBusy(conn))
		{
			wait_socket(WL_SOCKET_READABLE, -1);
			if (!PQconsumeInput(conn))
				source_error(src, "the connection failed");
		}
		r = PQgetResult(conn);
		if (r == NULL)
			break;
		if (last)
			PQclear(last);
		last = r;
		if (PQresultStatus(r) == PGRES_COPY_BOTH)
			break;
	}
	if (last == NULL || PQresultStatus(last) != expected)
	{
		char	   *msg = pstrdup(last ? pchomp(PQresultErrorMessage(last)) : "no result");
		char	   *state = last && PQresultErrorField(last, PG_DIAG_SQLSTATE)
			? pstrdup(PQresultErrorField(last, PG_DIAG_SQLSTATE)) : NULL;

		if (last)
			PQclear(last);
		ereport(ERROR, (errcode(state && strcmp(state, "42704") == 0 ? ERRCODE_UNDEFINED_OBJECT
								: ERRCODE_CONNECTION_FAILURE),
						errmsg("eventgrid: WAL source \"%s\": the source refused a command: %s", src->name, msg)));
	}
	return last;
}

/* Notes that the source's WAL up to remote is done with here once the local WAL up to local is flushed. */
static void
mark_done(XLogRecPtr remote, XLogRecPtr local)
{
	if (nmarks == maxmarks)
	{
		maxmarks = Max(64, maxmarks * 2);
		marks = marks ? repalloc(marks, maxmarks * sizeof(EgFlushMark))
			: MemoryContextAlloc(TopMemoryContext, maxmarks * sizeof(EgFlushMark));
	}
	marks[nmarks].remote = remote;
	marks[nmarks].local = local;
	nmarks++;
}

/* The source position whose work here is flushed (at least flushed); forgets the marks it passed. */
static XLogRecPtr
flushed_position(XLogRecPtr flushed)
{
	XLogRecPtr	local_flush = GetFlushRecPtr(NULL);
	int			done = 0;

	for (; done < nmarks && marks[done].local <= local_flush; done++)
		flushed = Max(flushed, marks[done].remote);
	if (done > 0)
	{
		memmove(marks, marks + done, (nmarks - done) * sizeof(EgFlushMark));
		nmarks -= done;
	}
	return flushed;
}

/* Tells the source that its WAL up to flushed is done with here. */
static void
send_feedback(EgWalSource *src, XLogRecPtr flushed)
{
	StringInfoData s;

	initStringInfo(&s);
	pq_sendbyte(&s, 'r');
	pq_sendint64(&s, flushed);	/* written */
	pq_sendint64(&s, flushed);	/* flushed */
	pq_sendint64(&s, flushed);	/* applied */
	pq_sendint64(&s, GetCurrentTimestamp());
	pq_sendbyte(&s, 0);
	if (PQputCopyData(conn, s.data, s.len) <= 0 || PQflush(conn) != 0)
		source_error(src, "could not send a status update");
	pfree(s.data);
}

/* A WAL source's definition, as its worker reads it at each connection. */
typedef struct EgWalDefinition
{
	char	   *connection;
	char	   *publication;
	char	   *slot;
	bool		owner_superuser;
	bool		backfill;		/* tables wait for their backfill */
} EgWalDefinition;

/*
 * Reads source id's definition into *def and src (in source_cxt), and sets
 * up its replication origin; the worker exits when the source was dropped
 * or paused.  Returns the origin's position: where the stream goes on.
 */
static XLogRecPtr
read_definition(int64 id, EgWalSource *src, EgWalDefinition *def)
{
	Datum		arg = Int64GetDatum(id);
	char		origin_name[EG_WAL_ORIGIN_NAME_LEN];
	RepOriginId origin;
	bool		paused;

	eg_wal_origin_name(id, origin_name);
	eg_wal_begin("eventgrid: reading a WAL source's definition");
	eg_store_run(&definition_stmt, &arg, SPI_OK_SELECT);
	if (SPI_processed == 0)
		proc_exit(0);			/* dropped */
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		MemoryContext old = MemoryContextSwitchTo(source_cxt);

		src->name = SPI_getvalue(row, desc, 1);
		def->connection = SPI_getvalue(row, desc, 2);
		def->publication = SPI_getvalue(row, desc, 3);
		def->slot = SPI_getvalue(row, desc, 4);
		src->slot = def->slot;
		src->message_prefix = SPI_getvalue(row, desc, 5);
		paused = DatumGetBool(SPI_getbinval(row, desc, 6, &isnull));
		def->owner_superuser = superuser_arg(DatumGetObjectId(SPI_getbinval(row, desc, 7, &isnull)));
		MemoryContextSwitchTo(old);
	}
	if (paused)
		proc_exit(0);
	origin = replorigin_by_name(origin_name, true);
	if (origin == InvalidRepOriginId)
		origin = replorigin_create(origin_name);
	def->backfill = eg_wal_backfill_pending(id);
	eg_store_commit();
	MemoryContextSwitchTo(source_cxt);
	if (replorigin_session_origin == InvalidRepOriginId)
	{
		StartTransactionCommand();
		eg_replorigin_session_setup(origin);
		replorigin_session_origin = origin;
		CommitTransactionCommand();
		MemoryContextSwitchTo(source_cxt);
	}
	return replorigin_session_get_progress(false);
}

/*
 * On the connected source: checks its publication, makes the slot when
 * there is none (and none was there before: start, the origin's position,
 * is invalid), and backfills when the definition says so (in the slot's
 * snapshot when it was just made, else in one of now).
 */
static void
prepare_slot(int64 id, EgWalSource *src, const EgWalDefinition *def, XLogRecPtr start)
{
	PGresult   *res;
	bool		in_snapshot = false;

	res = eg_wal_source_exec(src, "IDENTIFY_SYSTEM", PGRES_TUPLES_OK);
	src->system_identifier = pstrdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	src->database = pstrdup(PQdb(conn) ? PQdb(conn) : "");
	res = eg_wal_source_exec(src, psprintf("SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = %s",
									quote_literal_cstr(def->publication)), PGRES_TUPLES_OK);
	if (PQntuples(res) == 0)
	{
		PQclear(res);
		ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT),
						errmsg("eventgrid: WAL source \"%s\": the source database has no publication \"%s\"",
							   src->name, def->publication),
						errhint("Create it on the source: CREATE PUBLICATION %s (FOR TABLE ... to publish their changes; "
								"with no table it carries messages only).", quote_identifier(def->publication))));
	}
	PQclear(res);
	res = eg_wal_source_exec(src, psprintf("SELECT plugin FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
									quote_literal_cstr(def->slot)), PGRES_TUPLES_OK);
	if (PQntuples(res) == 0 && !XLogRecPtrIsInvalid(start))
	{
		/* a new slot would start at its own creation: what the source wrote since would be lost */
		PQclear(res);
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("eventgrid: WAL source \"%s\": the replication slot \"%s\" is gone from the source",
							   src->name, def->slot),
						errdetail("The source's changes after %X/%X, the last position published here, are no longer kept for it.",
								  LSN_FORMAT_ARGS(start)),
						errhint("Drop the WAL source and create it again (with backfill => true its tables' rows are published first).")));
	}
	if (PQntuples(res) == 0)
	{
		PQclear(res);
		/*
		 * A backfill reads the tables as of the slot's start: in the
		 * repeatable read transaction the slot is made in, with its
		 * snapshot (as the apply worker's table synchronization does).
		 */
		if (def->backfill)
		{
			eg_wal_backfill_check(src);	/* what would fail it: before the slot's snapshot is taken */
			PQclear(eg_wal_source_exec(src, "BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ", PGRES_COMMAND_OK));
		}
		res = eg_wal_source_exec(src, psprintf(PQserverVersion(conn) >= 150000
										? (def->backfill ? "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'use')"
										   : "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'nothing')")
										: (def->backfill ? "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput USE_SNAPSHOT"
										   : "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput NOEXPORT_SNAPSHOT"),
										quote_identifier(def->slot)), PGRES_TUPLES_OK);
		in_snapshot = def->backfill;
		ereport(LOG, (errmsg("eventgrid: WAL source \"%s\": created the replication slot \"%s\" on the source at %s",
							 src->name, def->slot, PQgetvalue(res, 0, 1))));
	}
	else if (strcmp(PQgetvalue(res, 0, 0), "pgoutput") != 0)
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("eventgrid: WAL source \"%s\": the slot \"%s\" on the source is not a pgoutput slot",
							   src->name, def->slot),
						errhint("Drop it on the source, or give the WAL source another slot_name.")));
	PQclear(res);
	if (def->backfill)
	{
		/* after a restart, or into a slot that was there: a snapshot of now (README says what that means) */
		if (!in_snapshot)
			PQclear(eg_wal_source_exec(src, "BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ", PGRES_COMMAND_OK));
		src->state = "backfilling";
		set_status(id, "backfilling", InvalidXLogRecPtr, NULL, InvalidXLogRecPtr);
		MemoryContextSwitchTo(source_cxt);
		pgstat_report_activity(STATE_RUNNING, "eventgrid: backfilling from the WAL source");
		eg_wal_backfill(src);
		MemoryContextSwitchTo(source_cxt);
		PQclear(eg_wal_source_exec(src, "COMMIT", PGRES_COMMAND_OK));
	}
}

/* Where the stream stands: what was read, flushed here, told the source, shown. */
typedef struct EgStreamState
{
	XLogRecPtr	flushed;
	XLogRecPtr	reported;
	XLogRecPtr	source_lsn;
	XLogRecPtr	status_lsn;
	XLogRecPtr	status_flushed;
	TimestampTz feedback_at;
	TimestampTz status_at;
} EgStreamState;

/*
 * One CopyData message of the stream (buf, len bytes): XLogData is
 * applied (eg_wal_apply()), a keepalive marks what came before it done
 * and, when the source asks, is answered.
 */
static void
stream_message(EgWalSource *src, EgStreamState *st, char *buf, int len)
{
	StringInfoData s;
	char		kind;

	s.data = buf;
	s.len = len;
	s.maxlen = len;
	s.cursor = 0;
	kind = pq_getmsgbyte(&s);
	if (kind == 'w')
	{
		XLogRecPtr	end;

		(void) pq_getmsgint64(&s);	/* where the data starts */
		end = pq_getmsgint64(&s);
		(void) pq_getmsgint64(&s);	/* the source's clock */
		st->source_lsn = Max(st->source_lsn, end);
		end = eg_wal_apply(src, &s);
		if (!XLogRecPtrIsInvalid(end) && !src->txn.local_open)
			mark_done(end, src->txn.local_end); /* committed here (or nothing to commit) */
	}
	else if (kind == 'k')
	{
		XLogRecPtr	end = pq_getmsgint64(&s);

		(void) pq_getmsgint64(&s);
		st->source_lsn = Max(st->source_lsn, end);
		/*
		 * Between transactions, all the source sent before this is
		 * applied: what it decoded and did not send (other tables'
		 * changes) is done with too, and its slot may move on.
		 */
		if (!src->in_txn)
			mark_done(end, InvalidXLogRecPtr);
		if (pq_getmsgbyte(&s))
		{
			st->flushed = flushed_position(st->flushed);
			send_feedback(src, st->flushed);
			st->reported = st->flushed;
			st->feedback_at = GetCurrentTimestamp();
		}
	}
}

/*
 * With nothing to read: tells the source what is flushed here (every
 * EG_WAL_FEEDBACK_MS, or as soon as it moved), writes the status between
 * transactions (every EG_WAL_STATUS_MS), and waits for the socket.
 */
static void
stream_idle(int64 id, EgWalSource *src, EgStreamState *st)
{
	st->flushed = flushed_position(st->flushed);
	if (GetCurrentTimestamp() - st->feedback_at >= (TimestampTz) EG_WAL_FEEDBACK_MS * 1000 ||
		st->flushed > st->reported)
	{
		send_feedback(src, st->flushed);
		st->feedback_at = GetCurrentTimestamp();
		st->reported = st->flushed;
	}
	if ((st->source_lsn != st->status_lsn || st->flushed != st->status_flushed) && !src->in_txn &&
		GetCurrentTimestamp() - st->status_at >= (TimestampTz) EG_WAL_STATUS_MS * 1000)
	{
		set_status(id, "streaming", st->source_lsn, NULL, st->flushed);
		MemoryContextSwitchTo(source_cxt);
		st->status_lsn = st->source_lsn;
		st->status_flushed = st->flushed;
		st->status_at = GetCurrentTimestamp();
	}
	wait_socket(WL_SOCKET_READABLE, 1000);
	if (!PQconsumeInput(conn))
		source_error(src, "the connection failed");
}

/*
 * Reads the source's definition, sets up its replication origin, connects
 * and streams until an error (or SIGTERM); once streaming, the backoff of
 * the next failure starts at 1 s again.  Does not return normally.
 */
static void
stream(int64 id, EgWalSource *src, long *backoff_ms)
{
	EgWalDefinition def;
	XLogRecPtr	start;
	EgStreamState st = {0};
	PGresult   *res;
	MemoryContext msg_cxt;

	MemoryContextReset(source_cxt);
	MemoryContextSwitchTo(source_cxt);
	start = read_definition(id, src, &def);
	st.flushed = start;
	st.reported = start;
	pgstat_report_activity(STATE_RUNNING, "eventgrid: connecting to the WAL source");
	set_status(id, "connecting", InvalidXLogRecPtr, NULL, InvalidXLogRecPtr);
	MemoryContextSwitchTo(source_cxt);

	source_connect(src, def.connection, def.owner_superuser);
	prepare_slot(id, src, &def, start);
	src->state = "streaming";
	res = eg_wal_source_exec(src, psprintf("START_REPLICATION SLOT %s LOGICAL %X/%X (proto_version '1', publication_names %s, messages 'true')",
									quote_identifier(def.slot), LSN_FORMAT_ARGS(start),
									quote_literal_cstr(quote_identifier(def.publication))), PGRES_COPY_BOTH);
	PQclear(res);
	eg_wal_reset_relations();
	nmarks = 0;					/* (those of a connection before: the new one starts at the origin's position) */
	src->in_txn = false;
	memset(&src->txn, 0, sizeof(src->txn));
	set_status(id, "streaming", InvalidXLogRecPtr, NULL, InvalidXLogRecPtr);
	*backoff_ms = EG_WAL_BACKOFF_MIN_MS;	/* connected: the next failure waits 1 s again */
	pgstat_report_activity(STATE_RUNNING, "eventgrid: streaming from the WAL source");
	ereport(LOG, (errmsg("eventgrid: WAL source \"%s\": streaming from %X/%X", src->name, LSN_FORMAT_ARGS(start))));
	st.feedback_at = GetCurrentTimestamp();
	msg_cxt = AllocSetContextCreate(source_cxt, "eventgrid WAL source message", ALLOCSET_DEFAULT_SIZES);

	for (;;)
	{
		char	   *buf;
		int			len;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		len = PQgetCopyData(conn, &buf, 1);
		if (len > 0)
		{
			MemoryContextSwitchTo(msg_cxt);
			stream_message(src, &st, buf, len);
			PQfreemem(buf);
			MemoryContextSwitchTo(source_cxt);
			MemoryContextReset(msg_cxt);
			continue;
		}
		if (len == -1)
		{
			res = PQgetResult(conn);
			if (res)
				PQclear(res);
			ereport(ERROR, (errcode(ERRCODE_CONNECTION_FAILURE),
							errmsg("eventgrid: WAL source \"%s\": the source ended the replication stream", src->name)));
		}
		if (len < -1)
			source_error(src, "the replication stream failed");
		stream_idle(id, src, &st);
	}
}

/*
 * The worker: bgw_main_arg the database's OID, bgw_extra the source's id.
 * Leaves when another worker has the source, when the source is paused or
 * dropped, and on SIGTERM; any error is retried with backoff.
 */
void
eventgrid_wal_source_main(Datum arg)
{
	Oid			dboid = DatumGetObjectId(arg);
	int64		id;
	LOCKTAG		tag;
	sigjmp_buf	local_sigjmp_buf;
	static long backoff_ms = EG_WAL_BACKOFF_MIN_MS; /* static: kept across the longjmp */
	static char *last_message = NULL;
	static EgWalSource src;

	memcpy(&id, MyBgworkerEntry->bgw_extra, sizeof(id));
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	/*
	 * As the other workers: no database or role default changes what its
	 * statements run (search_path) or what a commit means.
	 */
	eg_pin_settings();
	/*
	 * It commits asynchronously, as PostgreSQL's apply worker does: the
	 * source is told a position is done only once the local commit is
	 * flushed (mark_done()), and a commit lost in a crash here takes its
	 * origin progress with it, so that the source sends it again.
	 */
	SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, EG_WAL_SOURCE_LOCK_CLASS, (uint32) id, 2);
	if (LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		proc_exit(0);			/* another worker has it */
	source_cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid WAL source", ALLOCSET_DEFAULT_SIZES);

	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
	{
		ErrorData  *edata;
		char	   *message;

		error_context_stack = NULL;
		HOLD_INTERRUPTS();
		MemoryContextSwitchTo(TopMemoryContext);
		edata = CopyErrorData();
		/* the same error again (a source down for a while) is not logged again */
		if (last_message == NULL || strcmp(last_message, edata->message) != 0)
			EmitErrorReport();
		if (last_message)
			pfree(last_message);
		last_message = pstrdup(edata->message);
		AbortCurrentTransaction();
		FlushErrorState();
		if (conn)
			PQfinish(conn);
		conn = NULL;
		src.in_txn = false;
		src.txn.local_open = false;
		replorigin_session_origin_lsn = InvalidXLogRecPtr;
		replorigin_session_origin_timestamp = 0;
		message = edata->message;
		RESUME_INTERRUPTS();
		if (edata->hint)
			message = psprintf("%s (%s)", edata->message, edata->hint);
		set_status(id, "failing", InvalidXLogRecPtr, message, InvalidXLogRecPtr);
		FreeErrorData(edata);
		pgstat_report_activity(STATE_IDLE, "eventgrid: waiting to reconnect to the WAL source");
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, backoff_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		backoff_ms = Min(backoff_ms * 2, EG_WAL_BACKOFF_MAX_MS);
	}
	PG_exception_stack = &local_sigjmp_buf;
	src.id = id;
	src.state = "connecting";
	stream(id, &src, &backoff_ms);
}

/* See wal_source.h.  In the upkeep worker's unit of work. */
void
eg_wal_sources_start(void)
{
	Datum		args[2] = {ObjectIdGetDatum(MyDatabaseId), ObjectIdGetDatum(EG_WAL_SOURCE_LOCK_CLASS)};
	const char *db = get_database_name(MyDatabaseId);

	eg_store_run(&starting_stmt, args, SPI_OK_SELECT);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		BackgroundWorker w;
		BackgroundWorkerHandle *handle;
		bool		isnull;
		int64		sid = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
		char	   *name = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);

		/* as the other workers (the database in bgw_main_arg); the source's id in bgw_extra */
		eg_worker_spec(&w, "eventgrid_wal_source_main", "WAL source", MyDatabaseId, db, 0);
		snprintf(w.bgw_name, BGW_MAXLEN, "eventgrid WAL source %s [%s]", name, db);
		memcpy(w.bgw_extra, &sid, sizeof(sid));
		w.bgw_notify_pid = 0;	/* started and left alone: nobody waits for it */
		if (!RegisterDynamicBackgroundWorker(&w, &handle))
			ereport(LOG, (errmsg("eventgrid: no background worker slot for WAL source \"%s\"", name),
						  errhint("Raise max_worker_processes.")));
	}
}
