/*
 * serve_db.c - runs the HTTP listener's requests in the databases their URLs
 * name (SPEC 16), through libpq, asynchronously: each request is one
 * statement sent with PQsendQueryParams() on a connection of its database
 * that is free, and answered when its result arrives (eg_serve_poll(),
 * woken through eg_serve_wait_fd()), so that requests of many clients run
 * side by side in as many backends and a long poll holds only its own
 * connection.  At most eventgrid.http_max_requests_in_flight statements run
 * at once (each on a connection of its own); more wait, first come first
 * served within their shares: one database's long polls run on at most
 * half of them, one topic's on at most a quarter (share_allows()), so that
 * one key's long polls leave room for everyone else.
 *
 * Connections are opened when a request finds none free (over the server's
 * Unix socket, as the operating-system user the server runs as, which
 * pg_hba.conf must let in: Debian's "local all postgres peer" does) and
 * closed after a minute unused, as soon as DDL needs their database to
 * itself (DROP DATABASE: hooks.c holds the database's slot; a statement
 * running there is cancelled), or when their database goes or loses the
 * extension (eg_serve_tidy(), every second).  Each sets its role to
 * eventgrid_http at once: a role that may run the data plane's functions
 * and nothing else, which check the topic's keys themselves.  None logs its
 * statements: the parameters hold keys and events.
 *
 * libpq rather than SPI: a background worker is connected to one database
 * for life, and the listener serves them all (docs/ARCHITECTURE.md, "HTTP
 * data plane").  Only databases the launcher found with the extension in
 * this library's version (or has not looked into yet) are connected to.
 */
#include "serve/serve.h"

#include <sys/epoll.h>
#include <unistd.h>

#include "libpq-fe.h"
#include "postmaster/postmaster.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/varlena.h"

#define EG_SERVE_IDLE_MS 60000		/* a connection unused this long is closed */

typedef struct ServeConnection
{
	char		database[NAMEDATALEN];	/* "" when free */
	PGconn	   *conn;
	EgServeCall *call;			/* the statement it runs (NULL: idle) */
	bool		cancelled;		/* a cancel was sent for it */
	bool		writing;		/* its statement is not all sent: waits for the socket to take more */
	TimestampTz used_at;		/* when it last finished a statement */
} ServeConnection;

static ServeConnection connections[EG_HTTP_MAX_IN_FLIGHT_LIMIT];
static List *waiting = NIL;		/* calls no connection could take yet, oldest first */
static int	wait_fd = -1;		/* epoll set of the busy connections' sockets */

/* What the launcher knows of a database the listener is asked for. */
typedef enum ServeDbState
{
	SERVE_DB_OK,				/* the extension in this library's version, or not looked into yet */
	SERVE_DB_UNSERVED,			/* no such database, or without the extension (or in another version) */
	SERVE_DB_HELD				/* DDL needs it to itself (DROP DATABASE, RENAME, SET TABLESPACE) */
} ServeDbState;

static ServeDbState
db_state(const char *name)
{
	ServeDbState state = SERVE_DB_UNSERVED;

	if (eg_shared == NULL)
		return SERVE_DB_UNSERVED;
	SpinLockAcquire(&eg_shared->mutex);
	for (int i = 0; i < eg_shared->ndb; i++)
	{
		EgDbSlot   *db = &eg_shared->db[i];

		if (db->dboid != InvalidOid && db->present && strcmp(NameStr(db->name), name) == 0)
		{
			if (db->state == EG_DB_ABSENT || db->state == EG_DB_OTHER_VERSION)
				state = SERVE_DB_UNSERVED;
			else if (db->hold_pid != 0)
				state = SERVE_DB_HELD;
			else
				state = SERVE_DB_OK;
			break;
		}
	}
	SpinLockRelease(&eg_shared->mutex);
	return state;
}

/* Ends call with an answer: the caller's done() runs. */
static void
finish(EgServeCall *call, int status, const char *code, const char *message)
{
	MemoryContext old = MemoryContextSwitchTo(call->cxt);

	call->status = status;
	call->answer = code != NULL ? eg_serve_error_body(code, message) : pstrdup(message);
	MemoryContextSwitchTo(old);
	call->done(call);
}

static void
close_connection(ServeConnection *c)
{
	if (c->conn != NULL)
		PQfinish(c->conn);
	c->conn = NULL;
	c->call = NULL;
	c->database[0] = '\0';
}

/* The first directory of unix_socket_directories, or NULL (then TCP to localhost). */
static char *
socket_directory(void)
{
	char	   *raw;
	List	   *dirs;

	if (Unix_socket_directories == NULL || Unix_socket_directories[0] == '\0')
		return NULL;
	raw = pstrdup(Unix_socket_directories);
	if (!SplitDirectoriesString(raw, ',', &dirs) || dirs == NIL)
		return NULL;
	return (char *) linitial(dirs);
}

/* Opens c to database name and sets its role; false when it cannot (logged). */
static bool
open_connection(ServeConnection *c, const char *name)
{
	const char *keys[7];
	const char *values[7];
	char		port[16];
	PGresult   *res;
	bool		ok;

	snprintf(port, sizeof(port), "%d", PostPortNumber);
	keys[0] = "host";
	values[0] = socket_directory();
	if (values[0] == NULL)
		values[0] = "localhost";
	keys[1] = "port";
	values[1] = port;
	keys[2] = "dbname";
	values[2] = name;
	keys[3] = "application_name";
	values[3] = "eventgrid HTTP listener";
	keys[4] = "client_encoding";
	values[4] = "UTF8";

	/*
	 * Requests carry keys and untrusted events: none of it reaches the
	 * server's log, whatever log_statement says (the session is a
	 * superuser's until SET ROLE, so it may set these).  The statement
	 * timeout is above receive()'s longest wait (120 s); READ COMMITTED,
	 * which receive() requires, whatever the server's default.
	 */
	keys[5] = "options";
	values[5] = "-c statement_timeout=150s -c lock_timeout=10s -c default_transaction_isolation=read\\ committed"
		" -c log_statement=none"
		" -c log_min_duration_statement=-1 -c log_min_duration_sample=-1 -c log_parameter_max_length=0"
		" -c log_parameter_max_length_on_error=0 -c log_min_error_statement=panic";
	keys[6] = NULL;
	values[6] = NULL;
	c->conn = PQconnectdbParams(keys, values, 0);
	if (PQstatus(c->conn) != CONNECTION_OK)
	{
		/* the launcher knows the database: not a client's made-up name (and it has no control characters) */
		ereport(LOG,
				(errmsg("eventgrid HTTP listener: could not connect to database \"%s\"", name),
				 errdetail_internal("%s", PQerrorMessage(c->conn))));
		close_connection(c);
		return false;
	}
	res = PQexec(c->conn, "SET ROLE eventgrid_http");
	ok = PQresultStatus(res) == PGRES_COMMAND_OK;
	PQclear(res);
	if (!ok || PQsetnonblocking(c->conn, 1) != 0)
	{
		close_connection(c);
		return false;
	}
	strlcpy(c->database, name, NAMEDATALEN);
	c->used_at = GetCurrentTimestamp();
	return true;
}

/* A connection of database name that runs nothing, opened if need be; NULL when none may be had now. */
static ServeConnection *
free_connection(const char *name, bool *failed)
{
	ServeConnection *spare = NULL;
	ServeConnection *idle_other = NULL;
	int			busy = 0;

	*failed = false;
	for (int i = 0; i < eg_http_max_requests_in_flight; i++)
	{
		ServeConnection *c = &connections[i];

		if (c->conn == NULL)
		{
			if (spare == NULL)
				spare = c;
			continue;
		}
		if (c->call != NULL)
		{
			busy++;
			continue;
		}
		if (strcmp(c->database, name) == 0 && PQstatus(c->conn) == CONNECTION_OK)
			return c;
		if (idle_other == NULL || c->used_at < idle_other->used_at)
			idle_other = c;
	}
	if (busy >= eg_http_max_requests_in_flight)
		return NULL;
	if (spare == NULL)
	{
		/* every slot holds a connection: the least recently used idle one of another database goes */
		spare = idle_other;
		close_connection(spare);
	}
	if (!open_connection(spare, name))
	{
		*failed = true;
		return NULL;
	}
	return spare;
}

/* Sends call's statement on c; false when it could not be sent (c is closed). */
static bool
send_call(ServeConnection *c, EgServeCall *call)
{
	struct epoll_event ev;

	if (!PQsendQueryParams(c->conn, call->sql, call->nparams, NULL, call->params, NULL, NULL, 0))
	{
		close_connection(c);
		return false;
	}
	c->call = call;
	c->cancelled = false;
	c->writing = PQflush(c->conn) == 1;
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN | (c->writing ? EPOLLOUT : 0);
	ev.data.ptr = c;
	if (epoll_ctl(wait_fd, EPOLL_CTL_ADD, PQsocket(c->conn), &ev) != 0)
		ereport(FATAL, (errmsg("eventgrid HTTP listener: epoll_ctl failed: %m")));
	return true;
}

/* Sends what is left of c's statement; once all is sent, only its result is waited for. */
static bool
flush(ServeConnection *c)
{
	int			r = PQflush(c->conn);

	if (r < 0)
		return false;
	if (c->writing && r == 0)
	{
		struct epoll_event ev;

		memset(&ev, 0, sizeof(ev));
		ev.events = EPOLLIN;
		ev.data.ptr = c;
		(void) epoll_ctl(wait_fd, EPOLL_CTL_MOD, PQsocket(c->conn), &ev);
		c->writing = false;
	}
	return true;
}

/*
 * Whether call may take a connection now as far as its shares go: a long
 * poll (a receive, which may hold its connection for minutes) only while
 * its database runs fewer than half of eventgrid.http_max_requests_in_flight
 * long polls and its topic fewer than a quarter (each at least one); any
 * other request (a short statement) always.
 */
static bool
share_allows(const EgServeCall *call)
{
	int			db_share = Max(1, eg_http_max_requests_in_flight / 2);
	int			topic_share = Max(1, eg_http_max_requests_in_flight / 4);
	int			of_db = 0;
	int			of_topic = 0;

	if (!call->long_poll)
		return true;
	for (int i = 0; i < eg_http_max_requests_in_flight; i++)
	{
		const EgServeCall *other = connections[i].call;

		if (other == NULL || !other->long_poll || strcmp(other->database, call->database) != 0)
			continue;
		of_db++;
		if (call->topic != NULL && other->topic != NULL && strcmp(other->topic, call->topic) == 0)
			of_topic++;
	}
	return of_db < db_share && of_topic < topic_share;
}

/* Starts call, or says why it cannot run: true when it runs or waits for a connection. */
static bool
start(EgServeCall *call)
{
	ServeConnection *c;
	bool		failed;

	switch (db_state(call->database))
	{
		case SERVE_DB_UNSERVED:
			/* as a wrong key: whether a database exists is not told before a key is checked */
			finish(call, 401, "Unauthorized", EG_HTTP_UNAUTHORIZED_MESSAGE);
			return false;
		case SERVE_DB_HELD:
			finish(call, 503, "ServiceUnavailable", "The database is busy with a change of its own; try again.");
			return false;
		case SERVE_DB_OK:
			break;
	}
	c = free_connection(call->database, &failed);
	if (failed)
	{
		finish(call, 503, "ServiceUnavailable", "The database could not be reached; try again.");
		return false;
	}
	if (c == NULL)
		return false;			/* every slot runs a statement: it waits */
	if (!send_call(c, call))
	{
		finish(call, 503, "ServiceUnavailable", "The database could not take the request; try again.");
		return false;
	}
	return true;
}

/* See serve.h. */
char *
eg_serve_error_body(const char *code, const char *message)
{
	StringInfoData s;

	initStringInfo(&s);
	/* as the data plane's SQL writes it (jsonb's text): byte for byte the same answers */
	appendStringInfoString(&s, "{\"error\": {\"code\": ");
	escape_json(&s, code);
	appendStringInfoString(&s, ", \"message\": ");
	escape_json(&s, message);
	appendStringInfoString(&s, "}}");
	return s.data;
}

/* See serve.h. */
void
eg_serve_start(EgServeCall *call)
{
	MemoryContext old;

	ListCell   *lc;
	bool		behind = false;

	call->status = 0;
	(void) eg_serve_wait_fd();	/* the epoll set, made once */
	/* it waits behind calls that wait only for a connection (their shares allow them), never behind others */
	foreach(lc, waiting)
		if (share_allows((EgServeCall *) lfirst(lc)))
			behind = true;
	if (behind || !share_allows(call) || !start(call))
	{
		if (call->status != 0)
			return;				/* answered at once */
		old = MemoryContextSwitchTo(TopMemoryContext);
		waiting = lappend(waiting, call);
		MemoryContextSwitchTo(old);
	}
}

/* See serve.h. */
int
eg_serve_wait_fd(void)
{
	if (wait_fd < 0 && (wait_fd = epoll_create1(EPOLL_CLOEXEC)) < 0)
		ereport(FATAL, (errmsg("eventgrid HTTP listener: epoll_create1 failed: %m")));
	return wait_fd;
}

/* The answer to a statement that failed: what the client may be told, by SQLSTATE. */
static void
failed(EgServeCall *call, PGresult *res)
{
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	if (state == NULL)
		state = "";
	if (strcmp(state, "42883") == 0 || strcmp(state, "3F000") == 0 || strcmp(state, "42501") == 0)
	{
		/*
		 * the extension is not in this database (or not in a version with
		 * the data plane): as an unserved one, a wrong key, so that whether a
		 * database exists is not told (a database the listener had not yet
		 * found unserved, just created, comes here)
		 */
		finish(call, 401, "Unauthorized", EG_HTTP_UNAUTHORIZED_MESSAGE);
		return;
	}
	if (strncmp(state, "22", 2) == 0)
	{
		/* the request's text itself: not valid in the database's encoding */
		finish(call, 400, "BadRequest", "The request is not valid text in the database's encoding.");
		return;
	}
	ereport(LOG,
			(errmsg("eventgrid HTTP listener: a request failed in the database with SQLSTATE %s", state)));
	if (strcmp(state, "57014") == 0 || strncmp(state, "40", 2) == 0 || strncmp(state, "53", 2) == 0 ||
		strncmp(state, "55", 2) == 0 || strncmp(state, "57", 2) == 0 || strncmp(state, "08", 2) == 0)
		finish(call, 503, "ServiceUnavailable", "The database could not take the request now; try again.");
	else
		finish(call, 500, "InternalServerError", "The request failed in the database.");
}

/* c's statement is over (or its connection broke): answers its call. */
static void
complete(ServeConnection *c)
{
	EgServeCall *call = c->call;
	PGresult   *res;
	PGresult   *first = NULL;

	(void) epoll_ctl(wait_fd, EPOLL_CTL_DEL, PQsocket(c->conn), NULL);
	c->call = NULL;
	c->used_at = GetCurrentTimestamp();
	while ((res = PQgetResult(c->conn)) != NULL)
	{
		if (first == NULL)
			first = res;
		else
			PQclear(res);
	}
	if (first != NULL && PQresultStatus(first) == PGRES_TUPLES_OK && PQntuples(first) == 1 && PQnfields(first) == 2)
	{
		MemoryContext old = MemoryContextSwitchTo(call->cxt);

		call->status = atoi(PQgetvalue(first, 0, 0));
		call->answer = pstrdup(PQgetvalue(first, 0, 1));
		MemoryContextSwitchTo(old);
		call->done(call);
	}
	else if (first != NULL && PQresultStatus(first) == PGRES_FATAL_ERROR)
		failed(call, first);
	else
		finish(call, 503, "ServiceUnavailable", "The database could not take the request now; try again.");
	if (first != NULL)
		PQclear(first);
	if (PQstatus(c->conn) != CONNECTION_OK)
		close_connection(c);
}

/* See serve.h. */
void
eg_serve_poll(void)
{
	ListCell   *lc;

	for (int i = 0; i < eg_http_max_requests_in_flight; i++)
	{
		ServeConnection *c = &connections[i];

		if (c->call == NULL)
			continue;
		if (!flush(c) || !PQconsumeInput(c->conn) || !PQisBusy(c->conn))
			complete(c);
	}
	/* what waited, in order, while connections are free: each whose shares allow it */
	foreach(lc, waiting)
	{
		EgServeCall *call = lfirst(lc);

		if (!share_allows(call))
			continue;
		if (!start(call) && call->status == 0)
			break;				/* still no connection */
		waiting = foreach_delete_current(waiting, lc);
	}
}

/* See serve.h. */
void
eg_serve_tidy(void)
{
	TimestampTz now = GetCurrentTimestamp();

	for (int i = 0; i < eg_http_max_requests_in_flight; i++)
	{
		ServeConnection *c = &connections[i];
		ServeDbState state;

		if (c->conn == NULL)
			continue;
		state = db_state(c->database);
		if (c->call != NULL)
		{
			/* a statement (a long poll) where DDL needs the database: cancelled, answered 503 */
			if (state != SERVE_DB_OK && !c->cancelled)
			{
				PGcancel   *cancel = PQgetCancel(c->conn);
				char		errbuf[256];

				if (cancel != NULL)
				{
					(void) PQcancel(cancel, errbuf, sizeof(errbuf));
					PQfreeCancel(cancel);
				}
				c->cancelled = true;
			}
			continue;
		}
		if (state != SERVE_DB_OK || TimestampDifferenceExceeds(c->used_at, now, EG_SERVE_IDLE_MS))
			close_connection(c);
	}
}

/* See serve.h. */
void
eg_serve_disconnect(void)
{
	for (int i = 0; i < EG_HTTP_MAX_IN_FLIGHT_LIMIT; i++)
		close_connection(&connections[i]);
}
