/*
 * wal_source_functions.c - the SQL-callable helpers of WAL sources (SPEC
 * 16; sql/eventgrid--0.22.0--0.23.0.sql): the connection string's check
 * and its masked form, the position committed here, stopping a source's
 * worker and dropping its slot on the source.
 */
#include "publish/wal_source.h"

#include "access/xlogdefs.h"
#include "executor/spi.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "libpq-fe.h"
#include "miscadmin.h"
#include "replication/origin.h"
#include "utils/builtins.h"
#include "utils/pg_lsn.h"

#define EG_WAL_STOP_WAIT_MS 10000

/* value as a connection string's value: quoted when it must be */
static void
append_conn_value(StringInfo s, const char *value)
{
	bool		plain = value[0] != '\0';

	for (const char *p = value; *p; p++)
		if (*p == ' ' || *p == '\'' || *p == '\\' || *p == '=' || (unsigned char) *p < 0x20)
			plain = false;
	if (plain)
	{
		appendStringInfoString(s, value);
		return;
	}
	appendStringInfoChar(s, '\'');
	for (const char *p = value; *p; p++)
	{
		if (*p == '\'' || *p == '\\')
			appendStringInfoChar(s, '\\');
		appendStringInfoChar(s, *p);
	}
	appendStringInfoChar(s, '\'');
}

PG_FUNCTION_INFO_V1(eventgrid_wal_source_check_connection);

/*
 * SQL: eventgrid._wal_source_check_connection(connection text, owner oid)
 * -> text: the connection string parsed by libpq (22023 when it does not
 * parse), required to hold a password unless owner is a superuser (28000,
 * as postgres_fdw's password_required), returned with every setting it
 * makes and the password as ********.
 */
Datum
eventgrid_wal_source_check_connection(PG_FUNCTION_ARGS)
{
	char	   *conninfo = text_to_cstring(PG_GETARG_TEXT_PP(0));
	Oid			owner = PG_GETARG_OID(1);
	char	   *err = NULL;
	PQconninfoOption *opts = PQconninfoParse(conninfo, &err);
	StringInfoData s;
	bool		password = false;

	if (opts == NULL)
	{
		char	   *msg = err ? pchomp(err) : pstrdup("out of memory");

		if (err)
			PQfreemem(err);
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("invalid connection string: %s", msg),
						errhint("A libpq connection string: host=... port=... dbname=... user=... password=...")));
	}
	initStringInfo(&s);
	for (PQconninfoOption *o = opts; o->keyword; o++)
	{
		if (o->val == NULL)
			continue;
		if (strcmp(o->keyword, "password") == 0)
			password = password || o->val[0] != '\0';
		if (s.len > 0)
			appendStringInfoChar(&s, ' ');
		appendStringInfo(&s, "%s=", o->keyword);
		append_conn_value(&s, strcmp(o->keyword, "password") == 0 ? "********" : o->val);
	}
	PQconninfoFree(opts);
	if (!password && !superuser_arg(owner))
		ereport(ERROR, (errcode(ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION),
						errmsg("a WAL source created by a role that is not a superuser must connect with a password"),
						errhint("Put password=... in the connection string, and use password authentication on the source (as postgres_fdw requires).")));
	PG_RETURN_TEXT_P(cstring_to_text(s.data));
}

PG_FUNCTION_INFO_V1(eventgrid_wal_source_origin_lsn);

/*
 * SQL: eventgrid._wal_source_origin_lsn(source_id bigint) -> pg_lsn: the
 * source position whose events are committed here (its replication
 * origin's), NULL before the first.
 */
Datum
eventgrid_wal_source_origin_lsn(PG_FUNCTION_ARGS)
{
	char		name[EG_WAL_ORIGIN_NAME_LEN];
	RepOriginId origin;
	XLogRecPtr	lsn;

	eg_wal_origin_name(PG_GETARG_INT64(0), name);
	origin = replorigin_by_name(name, true);
	if (origin == InvalidRepOriginId)
		PG_RETURN_NULL();
	lsn = replorigin_get_progress(origin, false);
	if (XLogRecPtrIsInvalid(lsn))
		PG_RETURN_NULL();
	PG_RETURN_LSN(lsn);
}

PG_FUNCTION_INFO_V1(eventgrid_wal_source_stop);

/*
 * SQL: eventgrid._wal_source_stop(source_id bigint, drop_origin boolean):
 * terminates the source's worker (the holder of its advisory lock) and
 * waits up to 10 s for it to go; with drop_origin, drops its replication
 * origin then.
 */
Datum
eventgrid_wal_source_stop(PG_FUNCTION_ARGS)
{
	int64		id = PG_GETARG_INT64(0);
	bool		drop_origin = PG_GETARG_BOOL(1);
	char	   *sql = psprintf("SELECT pg_catalog.pg_terminate_backend(l.pid, %d) FROM pg_catalog.pg_locks l"
							   " WHERE l.locktype = 'advisory' AND l.database = %u AND l.classid = %u"
							   "   AND l.objid = %u AND l.objsubid = 2 AND l.granted",
							   EG_WAL_STOP_WAIT_MS, MyDatabaseId, (unsigned) EG_WAL_SOURCE_LOCK_CLASS, (uint32) id);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "eventgrid: SPI_connect failed");
	if (SPI_execute(sql, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "eventgrid: could not stop the worker of WAL source " INT64_FORMAT, id);
	SPI_finish();
	if (drop_origin)
	{
		char		name[EG_WAL_ORIGIN_NAME_LEN];

		eg_wal_origin_name(id, name);
		replorigin_drop_by_name(name, true, false);
	}
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(eventgrid_wal_source_drop_slot);

/*
 * SQL: eventgrid._wal_source_drop_slot(connection text, slot_name text,
 * owner oid) -> boolean: drops the slot on the source (a plain connection;
 * the slot may stay active for a moment after its worker is gone: tried
 * for up to 10 s); false when there is none.  As the worker, a source that
 * a role other than a superuser created is reached only with a password
 * used (else an admin could drop any slot of a server that trusts local
 * connections).  08001 when the source cannot be reached, 28000 when it
 * did not ask for the password, 55006 when the slot stays in use.
 */
Datum
eventgrid_wal_source_drop_slot(PG_FUNCTION_ARGS)
{
	char	   *conninfo = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *slot = text_to_cstring(PG_GETARG_TEXT_PP(1));
	Oid			owner = PG_GETARG_OID(2);
	const char *keys[] = {"dbname", "fallback_application_name", "connect_timeout", NULL};
	const char *vals[] = {conninfo, "eventgrid", "10", NULL};
	PGconn	   *c = PQconnectdbParams(keys, vals, 1);
	char	   *sql = psprintf("SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots"
							   " WHERE slot_name = %s", quote_literal_cstr(slot));
	bool		dropped = false;

	if (c == NULL || PQstatus(c) != CONNECTION_OK)
	{
		char	   *msg = pstrdup(c ? pchomp(PQerrorMessage(c)) : "out of memory");

		if (c)
			PQfinish(c);
		ereport(ERROR, (errcode(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION),
						errmsg("could not connect to the WAL source's database to drop its slot \"%s\": %s", slot, msg),
						errhint("drop_wal_source(name, drop_slot => false) drops the source here alone; then drop the slot on the source.")));
	}
	if (!superuser_arg(owner) && !PQconnectionUsedPassword(c))
	{
		PQfinish(c);
		ereport(ERROR, (errcode(ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION),
						errmsg("the WAL source's database did not ask for the password: its slot \"%s\" is not dropped", slot),
						errdetail("The source was created by a role that is not a superuser: its connection must authenticate with a password."),
						errhint("drop_wal_source(name, drop_slot => false) drops the source here alone.")));
	}
	for (int tries = 0;; tries++)
	{
		PGresult   *r = PQexec(c, sql);

		if (PQresultStatus(r) == PGRES_TUPLES_OK)
		{
			dropped = PQntuples(r) > 0;
			PQclear(r);
			break;
		}
		if (tries * 100 >= EG_WAL_STOP_WAIT_MS)
		{
			char	   *msg = pstrdup(pchomp(PQresultErrorMessage(r)));

			PQclear(r);
			PQfinish(c);
			ereport(ERROR, (errcode(ERRCODE_OBJECT_IN_USE),
							errmsg("could not drop the WAL source's slot \"%s\" on the source: %s", slot, msg)));
		}
		PQclear(r);
		pg_usleep(100 * 1000L);
	}
	PQfinish(c);
	PG_RETURN_BOOL(dropped);
}
