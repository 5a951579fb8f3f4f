/*
 * serve_db.c - runs the HTTP listener's requests in the databases their URLs
 * name (SPEC 16), through libpq: one connection per database, opened at its
 * first request over the server's Unix socket (as the operating-system
 * user the server runs as, which pg_hba.conf must let in: Debian's
 * "local all postgres peer" does), kept while the listener runs, at most
 * EG_SERVE_MAX_CONNECTIONS at once (the least recently used is closed for
 * another).  Each connection sets its role to eventgrid_http at once: a
 * role that may run the data plane's functions and nothing else, which
 * check the topic's keys themselves (eventgrid._http_publish()).
 *
 * libpq rather than SPI: a background worker is connected to one database
 * for life, and the listener serves them all (docs/ARCHITECTURE.md, "HTTP
 * data plane").  Only databases the launcher found with the extension in
 * this library's version (or has not looked into yet) are connected to,
 * and a connection is closed as soon as DDL needs its database to itself
 * (DROP DATABASE: hooks.c holds the database's slot) or after a minute
 * unused (eg_serve_tidy(), every second).
 */
#include "serve/serve.h"

#include "libpq-fe.h"
#include "postmaster/postmaster.h"
#include "utils/memutils.h"
#include "utils/varlena.h"

#define EG_SERVE_MAX_CONNECTIONS 32
#define EG_SERVE_IDLE_MS 60000		/* a connection unused this long is closed */

typedef struct ServeConnection
{
	char		database[NAMEDATALEN];	/* "" when free */
	PGconn	   *conn;
	uint64		used;			/* when it last ran a request, in requests */
	TimestampTz used_at;		/* and when, on the real clock */
} ServeConnection;

static ServeConnection connections[EG_SERVE_MAX_CONNECTIONS];
static uint64 requests = 0;

#define PUBLISH_SQL "SELECT status, answer FROM eventgrid._http_publish($1, $2, $3, $4, $5, $6, $7)"

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

static void
close_connection(ServeConnection *c)
{
	if (c->conn != NULL)
		PQfinish(c->conn);
	c->conn = NULL;
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

/* A connection to database name, its role set; NULL when it cannot be had (*status says why). */
static PGconn *
connection_for(const char *name, int *status)
{
	ServeConnection *c = NULL;
	ServeConnection *oldest = &connections[0];
	const char *keys[7];
	const char *values[7];
	char		port[16];
	PGresult   *res;
	bool		role_ok;

	for (int i = 0; i < EG_SERVE_MAX_CONNECTIONS; i++)
	{
		if (strcmp(connections[i].database, name) == 0)
			c = &connections[i];
		if (connections[i].used < oldest->used)
			oldest = &connections[i];
	}
	if (c != NULL && PQstatus(c->conn) == CONNECTION_OK)
	{
		c->used = ++requests;
		c->used_at = GetCurrentTimestamp();
		return c->conn;
	}
	if (c == NULL)
		c = oldest;
	close_connection(c);

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
	 * superuser's until SET ROLE, so it may set these).
	 */
	keys[5] = "options";
	values[5] = "-c statement_timeout=30s -c lock_timeout=10s -c log_statement=none"
		" -c log_min_duration_statement=-1 -c log_min_duration_sample=-1 -c log_parameter_max_length=0"
		" -c log_parameter_max_length_on_error=0 -c log_min_error_statement=panic";
	keys[6] = NULL;
	values[6] = NULL;
	c->conn = PQconnectdbParams(keys, values, 0);
	if (PQstatus(c->conn) != CONNECTION_OK)
	{
		/* the launcher knows it: not a client's made-up name (and it has no control characters) */
		ereport(LOG,
				(errmsg("eventgrid HTTP listener: could not connect to database \"%s\"", name),
				 errdetail_internal("%s", PQerrorMessage(c->conn))));
		close_connection(c);
		*status = 503;
		return NULL;
	}
	res = PQexec(c->conn, "SET ROLE eventgrid_http");
	role_ok = PQresultStatus(res) == PGRES_COMMAND_OK;
	PQclear(res);
	if (!role_ok)
	{
		close_connection(c);
		*status = 404;			/* the extension was never created in this cluster */
		return NULL;
	}
	strlcpy(c->database, name, NAMEDATALEN);
	c->used = ++requests;
	c->used_at = GetCurrentTimestamp();
	return c->conn;
}

/* The answer to a statement that failed: what the client may be told, by SQLSTATE. */
static char *
failed(PGresult *res, int *status)
{
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	if (state == NULL)
		state = "";
	if (strcmp(state, "42883") == 0 || strcmp(state, "3F000") == 0 || strcmp(state, "42501") == 0)
	{
		/* the extension is not in this database (or not in a version with the data plane) */
		*status = 404;
		return eg_serve_error_body("NotFound", "No such database with Event Grid's data plane.");
	}
	if (strncmp(state, "22", 2) == 0)
	{
		/* the request's text itself: not valid in the database's encoding */
		*status = 400;
		return eg_serve_error_body("BadRequest", "The request body is not valid text in the database's encoding.");
	}
	ereport(LOG,
			(errmsg("eventgrid HTTP listener: a request failed in the database with SQLSTATE %s", state)));
	if (strcmp(state, "57014") == 0 || strncmp(state, "40", 2) == 0 || strncmp(state, "53", 2) == 0 ||
		strncmp(state, "55", 2) == 0 || strncmp(state, "57", 2) == 0 || strncmp(state, "08", 2) == 0)
	{
		*status = 503;
		return eg_serve_error_body("ServiceUnavailable", "The database could not take the request now; try again.");
	}
	*status = 500;
	return eg_serve_error_body("InternalServerError", "The request failed in the database.");
}

/* See serve.h. */
char *
eg_serve_publish(const EgPublishRequest *req, int *status)
{
	const char *params[7];
	PGresult   *res;
	PGconn	   *conn;
	char	   *body;

	switch (db_state(req->database))
	{
		case SERVE_DB_UNSERVED:
			*status = 404;
			return eg_serve_error_body("NotFound", "No such database with Event Grid's data plane.");
		case SERVE_DB_HELD:
			*status = 503;
			return eg_serve_error_body("ServiceUnavailable", "The database is busy with a change of its own; try again.");
		case SERVE_DB_OK:
			break;
	}
	conn = connection_for(req->database, status);
	if (conn == NULL)
		return *status == 404 ?
			eg_serve_error_body("NotFound", "No such database with Event Grid's data plane.") :
			eg_serve_error_body("ServiceUnavailable", "The database could not be reached; try again.");

	params[0] = req->topic;
	params[1] = req->path;
	params[2] = req->sas_key;
	params[3] = req->sas_token;
	params[4] = req->authorization;
	params[5] = req->content_type;
	params[6] = req->body;
	res = PQexecParams(conn, PUBLISH_SQL, 7, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
	{
		*status = atoi(PQgetvalue(res, 0, 0));
		body = pstrdup(PQgetvalue(res, 0, 1));
	}
	else
	{
		body = failed(res, status);
		if (PQstatus(conn) != CONNECTION_OK)
		{
			for (int i = 0; i < EG_SERVE_MAX_CONNECTIONS; i++)
				if (connections[i].conn == conn)
					close_connection(&connections[i]);
		}
	}
	PQclear(res);
	return body;
}

/* See serve.h. */
void
eg_serve_tidy(void)
{
	TimestampTz now = GetCurrentTimestamp();

	for (int i = 0; i < EG_SERVE_MAX_CONNECTIONS; i++)
	{
		ServeConnection *c = &connections[i];

		if (c->conn != NULL &&
			(db_state(c->database) != SERVE_DB_OK ||
			 TimestampDifferenceExceeds(c->used_at, now, EG_SERVE_IDLE_MS)))
			close_connection(c);
	}
}

/* See serve.h. */
void
eg_serve_disconnect(void)
{
	for (int i = 0; i < EG_SERVE_MAX_CONNECTIONS; i++)
		close_connection(&connections[i]);
}
