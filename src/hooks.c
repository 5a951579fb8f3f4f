/*
 * hooks.c - what eventgrid does in every backend, as the library is
 * preloaded:
 *  - the utility hook: a database's workers leave for the DDL that needs
 *    the database to itself, once PostgreSQL's own checks let the statement
 *    run, and come back when it ends; CREATE, ALTER and DROP EXTENSION
 *    eventgrid and COMMIT PREPARED are followed;
 *  - the error hook: errors raised inside eventgrid's own functions lose
 *    the CONTEXT frames of its internals, a worker's lines name their
 *    database, and "permission denied" for one of eventgrid's objects gets
 *    a hint naming the role to grant;
 * and eventgrid._log(), a LOG line without statement or context.
 */
#include "hooks.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_attribute.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "catalog/pg_proc.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/tcopprot.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/catcache.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

static ProcessUtility_hook_type prev_process_utility_hook = NULL;

static void eg_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
							   ProcessUtilityContext context, ParamListInfo params,
							   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc);

/* See hooks.h. */
void
eg_ddl_holds_install(void)
{
	prev_process_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = eg_process_utility;
}

/* The database a DDL statement needs to itself (no other session connected), or InvalidOid. */
static Oid
database_needed(Node *stmt)
{
	ListCell   *lc;

	if (IsA(stmt, DropdbStmt))
		return get_database_oid(((DropdbStmt *) stmt)->dbname, true);
	if (IsA(stmt, RenameStmt) && ((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
		return get_database_oid(((RenameStmt *) stmt)->subname, true);
	if (IsA(stmt, AlterDatabaseStmt))
	{
		foreach(lc, ((AlterDatabaseStmt *) stmt)->options)
			if (strcmp(lfirst_node(DefElem, lc)->defname, "tablespace") == 0)
				return get_database_oid(((AlterDatabaseStmt *) stmt)->dbname, true);
	}
	if (IsA(stmt, CreatedbStmt))
	{
		foreach(lc, ((CreatedbStmt *) stmt)->options)
		{
			DefElem    *d = lfirst_node(DefElem, lc);

			if (strcmp(d->defname, "template") == 0 && d->arg != NULL)
				return get_database_oid(defGetString(d), true);
		}
	}
	return InvalidOid;
}

/* Is the current user the owner of database dboid (or a superuser)? */
static bool
owns_database(Oid dboid)
{
	return eg_database_ownercheck(dboid, GetUserId());
}

/*
 * Has the current role the CREATEDB privilege (a superuser has)?  Read from
 * pg_authid as PostgreSQL's own check does: its have_createdb_privilege()
 * is declared in a header only since a later 15 minor release.
 */
static bool
may_create_databases(void)
{
	HeapTuple	tup;
	bool		result;

	if (superuser())
		return true;
	tup = SearchSysCache1(AUTHOID, ObjectIdGetDatum(GetUserId()));
	if (!HeapTupleIsValid(tup))
		return false;
	result = ((Form_pg_authid) GETSTRUCT(tup))->rolcreatedb;
	ReleaseSysCache(tup);
	return result;
}

/*
 * Will PostgreSQL run stmt, which needs database dboid to itself?  The
 * checks PostgreSQL makes before it looks for other sessions: the
 * transaction block (DROP DATABASE, CREATE DATABASE and ALTER DATABASE
 * ... SET TABLESPACE refuse one: PreventInTransactionBlock raises
 * PostgreSQL's own error here), the ownership of the database (DROP,
 * RENAME, SET TABLESPACE), the CREATEDB privilege (RENAME, CREATE), and
 * for a template that is not marked as one, its ownership.  false: the
 * statement fails, so the database's workers are not asked to leave for it.
 */
static bool
ddl_will_run(Node *stmt, Oid dboid, ProcessUtilityContext context)
{
	bool		top = context == PROCESS_UTILITY_TOPLEVEL;

	if (dboid == MyDatabaseId)
		return false;		/* PostgreSQL refuses the open database */
	if (IsA(stmt, DropdbStmt))
	{
		PreventInTransactionBlock(top, "DROP DATABASE");
		return owns_database(dboid);
	}
	if (IsA(stmt, RenameStmt))
		return owns_database(dboid) && may_create_databases();
	if (IsA(stmt, AlterDatabaseStmt))
	{
		PreventInTransactionBlock(top, "ALTER DATABASE SET TABLESPACE");
		return owns_database(dboid);
	}
	if (IsA(stmt, CreatedbStmt))
	{
		HeapTuple	tup;
		bool		istemplate;

		PreventInTransactionBlock(top, "CREATE DATABASE");
		if (!may_create_databases())
			return false;
		tup = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(dboid));
		if (!HeapTupleIsValid(tup))
			return false;
		istemplate = ((Form_pg_database) GETSTRUCT(tup))->datistemplate;
		ReleaseSysCache(tup);
		return istemplate || owns_database(dboid);
	}
	return false;
}

/* Does stmt create, alter or drop extension eventgrid? */
static bool
changes_extension(Node *stmt)
{
	ListCell   *lc;

	if (IsA(stmt, CreateExtensionStmt))
		return strcmp(((CreateExtensionStmt *) stmt)->extname, "eventgrid") == 0;
	if (IsA(stmt, AlterExtensionStmt))
		return strcmp(((AlterExtensionStmt *) stmt)->extname, "eventgrid") == 0;
	if (IsA(stmt, DropStmt) && ((DropStmt *) stmt)->removeType == OBJECT_EXTENSION)
	{
		foreach(lc, ((DropStmt *) stmt)->objects)
			if (strcmp(strVal(lfirst(lc)), "eventgrid") == 0)
				return true;
	}
	return false;
}

/*
 * Utility statements eventgrid follows (in every backend, as the library is
 * preloaded):
 *  - DROP DATABASE, ALTER DATABASE ... RENAME TO / SET TABLESPACE and
 *    CREATE DATABASE ... TEMPLATE need their database to themselves: when
 *    PostgreSQL's own checks let the statement run (ddl_will_run), its
 *    workers leave first (eg_db_hold_for_ddl), so eventgrid never makes it
 *    wait, and come back as soon as the statement ends, failed or not (a
 *    dropped database's slot is let go at commit, which follows DROP
 *    DATABASE at once: it runs in no transaction block);
 *  - CREATE, ALTER and DROP EXTENSION eventgrid: once committed, the
 *    launcher looks at the database again at once;
 *  - COMMIT PREPARED runs in a session that may never have published, so
 *    the commit callback of the publishing transaction cannot wake the
 *    workers: they are woken after every COMMIT PREPARED instead (an idle
 *    worker finds nothing new).
 */
static void
eg_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
				   ProcessUtilityContext context, ParamListInfo params,
				   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;
	bool		commit_prepared = IsA(stmt, TransactionStmt) &&
		((TransactionStmt *) stmt)->kind == TRANS_STMT_COMMIT_PREPARED;
	Oid			needed = database_needed(stmt);

	if (OidIsValid(needed) && !ddl_will_run(stmt, needed, context))
		needed = InvalidOid;
	if (OidIsValid(needed))
	{
		eg_register_xact_callback();
		eg_db_hold_for_ddl(needed);
	}
	if (changes_extension(stmt))
		eg_extension_changed_at_commit();
	PG_TRY();
	{
		if (prev_process_utility_hook)
			prev_process_utility_hook(pstmt, queryString, readOnlyTree, context, params,
									  queryEnv, dest, qc);
		else
			standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
									queryEnv, dest, qc);
	}
	PG_CATCH();
	{
		if (OidIsValid(needed))
			eg_db_release_holds(false);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (OidIsValid(needed) && IsA(stmt, DropdbStmt))
		eg_database_dropped_at_commit();
	else if (OidIsValid(needed))
		eg_db_release_holds(false);
	if (commit_prepared)
		eg_wake_worker();
}

static emit_log_hook_type prev_emit_log_hook = NULL;

static void eg_emit_log(ErrorData *edata);

/* See hooks.h. */
void
eg_log_hook_install(void)
{
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = eg_emit_log;
}

PG_FUNCTION_INFO_V1(eventgrid_log);

/*
 * SQL: eventgrid._log(message): a LOG line without the STATEMENT and
 * CONTEXT lines PL/pgSQL's RAISE LOG would add (the statement may name a
 * secret endpoint URL).
 */
Datum
eventgrid_log(PG_FUNCTION_ARGS)
{
	ereport(LOG, (errmsg("%s", text_to_cstring(PG_GETARG_TEXT_PP(0))), errhidestmt(true), errhidecontext(true)));
	PG_RETURN_VOID();
}

/*
 * Is the object that "permission denied for <kind> <name>" names one of
 * eventgrid's (a relation or function in schema eventgrid)?  Syscache
 * look-ups only: called from the error hook, inside the failing transaction.
 */
static bool
eventgrid_object(const char *message, const char *name)
{
	Oid			nsp = get_namespace_oid("eventgrid", true);
	bool		found = false;

	if (!OidIsValid(nsp))
		return false;
	if (strstr(message, "for function ") != NULL || strstr(message, "for procedure ") != NULL)
	{
		CatCList   *list = SearchSysCacheList1(PROCNAMEARGSNSP, CStringGetDatum(name));

		for (int i = 0; i < list->n_members && !found; i++)
			found = ((Form_pg_proc) GETSTRUCT(&list->members[i]->tuple))->pronamespace == nsp;
		ReleaseSysCacheList(list);
		return found;
	}
	return OidIsValid(get_relname_relid(name, nsp));
}

/* Does s contain needle, ignoring ASCII case?  (Queries may be large: no copy.) */
static bool
contains_ci(const char *s, const char *needle)
{
	size_t		n = strlen(needle);

	for (; *s; s++)
		if (pg_strncasecmp(s, needle, n) == 0)
			return true;
	return false;
}

/*
 * The columns of eventgrid's relation relname that role may use for mode
 * (ACL_INSERT, ACL_SELECT) by column privileges, comma-separated, or NULL
 * when there are none (or the relation is not found).  Syscache look-ups
 * only: called from the error hook, inside the failing transaction.
 */
static char *
granted_columns(const char *relname, Oid role, AclMode mode)
{
	Oid			nsp = get_namespace_oid("eventgrid", true);
	Oid			relid = OidIsValid(nsp) ? get_relname_relid(relname, nsp) : InvalidOid;
	StringInfoData cols;

	if (!OidIsValid(relid))
		return NULL;
	initStringInfo(&cols);
	/* user columns are numbered 1, 2, ... with no gap (dropped ones keep their row) */
	for (AttrNumber a = 1;; a++)
	{
		HeapTuple	tup = SearchSysCache2(ATTNUM, ObjectIdGetDatum(relid), Int16GetDatum(a));
		Form_pg_attribute att;

		if (!HeapTupleIsValid(tup))
			break;
		att = (Form_pg_attribute) GETSTRUCT(tup);
		if (!att->attisdropped && pg_attribute_aclcheck(relid, a, role, mode) == ACLCHECK_OK)
			appendStringInfo(&cols, "%s%s", cols.len ? ", " : "", NameStr(att->attname));
		ReleaseSysCache(tup);
	}
	if (cols.len == 0)
	{
		pfree(cols.data);
		return NULL;
	}
	return cols.data;
}

/* The start of the context frame after the one at line (NULL: it is the last). */
static const char *
next_frame(const char *line)
{
	static const char *const starts[] = {"PL/pgSQL function ", "SQL statement \"", "SQL function \""};

	for (const char *nl = strchr(line, '\n'); nl != NULL; nl = strchr(nl + 1, '\n'))
		for (int i = 0; i < (int) lengthof(starts); i++)
			if (strncmp(nl + 1, starts[i], strlen(starts[i])) == 0)
				return nl + 1;
	return NULL;
}

/*
 * An error a user caused inside eventgrid's PL/pgSQL functions (a bad
 * argument, a missing topic, an event the publish trigger refuses) carries
 * CONTEXT frames naming eventgrid's own helpers ("PL/pgSQL function
 * eventgrid._check_range(...) line 4 at RAISE") and the statements they
 * ran ("SQL statement \"WITH stored AS (INSERT INTO eventgrid.events
 * ..."), each statement of as many lines as its text.  Those frames are
 * dropped: the leading run of frames that are eventgrid's PL/pgSQL
 * functions or statements run inside them, up to the last of eventgrid's
 * frames in the run; the frames of the caller's own functions, after them,
 * stay.  Errors of the internal classes (XX, 53, 57, 58) keep their
 * context, which tells where to look.  SQLSTATE, message, DETAIL and HINT
 * are unchanged.
 */
static void
drop_internal_context(ErrorData *edata)
{
	const char *ours = "PL/pgSQL function eventgrid.";
	int			class = ERRCODE_TO_CATEGORY(edata->sqlerrcode);
	const char *frame;
	const char *keep_from = NULL;

	if (edata->context == NULL || edata->elevel < ERROR ||
		class == ERRCODE_TO_CATEGORY(ERRCODE_INTERNAL_ERROR) ||
		class == ERRCODE_TO_CATEGORY(ERRCODE_INSUFFICIENT_RESOURCES) ||
		class == ERRCODE_TO_CATEGORY(ERRCODE_OPERATOR_INTERVENTION) ||
		class == ERRCODE_TO_CATEGORY(ERRCODE_SYSTEM_ERROR))
		return;
	for (frame = edata->context; frame != NULL && *frame != '\0'; frame = next_frame(frame))
	{
		if (strncmp(frame, ours, strlen(ours)) == 0)
			keep_from = next_frame(frame);
		else if (strncmp(frame, "SQL statement \"", 15) != 0)
			break;
		if (keep_from == NULL && strncmp(frame, ours, strlen(ours)) == 0)
		{
			edata->context = NULL;	/* every frame was ours */
			return;
		}
	}
	if (keep_from != NULL)
		edata->context = pstrdup(keep_from);
}

/*
 * PostgreSQL's own "permission denied for table events" or "... for function
 * create_topic" names no role.  For such an error (42501 from the privilege
 * check) about one of eventgrid's objects, in a statement that names
 * eventgrid.*, add a hint saying which of eventgrid's roles to grant, or,
 * for a role that may use some of the table's columns (a publisher
 * inserting a column eventgrid sets, or reading a table it may read only in
 * part), which columns it may use.  Only the hint is added; the error is
 * unchanged.  Runs in backends that loaded the library at start
 * (shared_preload_libraries), for errors that reach the server log;
 * drop_internal_context() first.
 */
static void
eg_emit_log(ErrorData *edata)
{
	const char *object;
	const char *user = NULL;
	char	   *cols = NULL;
	bool		inserting;
	bool		admin;

	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
	drop_internal_context(edata);
	/* a worker's lines name its database (several are served) */
	if (eg_log_database != NULL && edata->message != NULL && edata->output_to_server &&
		strstr(edata->message, "database \"") == NULL)
		edata->message = psprintf("%s (database \"%s\")", edata->message, eg_log_database);
	if (edata->elevel < ERROR || edata->sqlerrcode != ERRCODE_INSUFFICIENT_PRIVILEGE ||
		edata->hint != NULL || edata->message_id == NULL || edata->message == NULL ||
		strncmp(edata->message_id, "permission denied for ", 22) != 0 ||
		debug_query_string == NULL || !contains_ci(debug_query_string, "eventgrid."))
		return;

	object = strrchr(edata->message, ' ');
	object = object ? object + 1 : edata->message;
	if (!IsTransactionState() || !eventgrid_object(edata->message, object))
		return;
	inserting = strcmp(object, "events") == 0 && contains_ci(debug_query_string, "insert");
	user = GetUserNameFromId(GetUserId(), true);
	if (object[0] != '_' && strstr(edata->message, "for table ") != NULL)
		cols = granted_columns(object, GetUserId(), inserting ? ACL_INSERT : ACL_SELECT);
	if (user == NULL)
		user = "<role>";
	admin = OidIsValid(get_role_oid("eventgrid_admin", true)) &&
		has_privs_of_role(GetUserId(), get_role_oid("eventgrid_admin", true));
	if (strcmp(object, "served_databases") == 0 || strcmp(object, "_served_databases") == 0)
		edata->hint = psprintf("The launcher's view of every database is for superusers and members of pg_monitor: GRANT pg_monitor TO %s;",
							   quote_identifier(user));
	else if (object[0] == '_')
		edata->hint = pstrdup("Functions whose names start with an underscore are eventgrid's internals; they are not meant to be called directly.");
	else if (inserting && cols != NULL)
		edata->hint = psprintf("Role %s may set only these columns of eventgrid.events: %s; eventgrid sets the others. Write INSERT INTO eventgrid.events (%s) VALUES (...), without OVERRIDING SYSTEM VALUE.",
							   quote_identifier(user), cols, cols);
	else if (inserting)
		edata->hint = psprintf("Publishing requires the role eventgrid_publisher: GRANT eventgrid_publisher TO %s;",
							   quote_identifier(user));
	else if (cols != NULL && admin)
		/* an admin reads all but the secrets: no other role would let it read more */
		edata->hint = psprintf("Role %s may read only these columns of eventgrid.%s: %s; name them instead of * (the others hold secrets, which no role reads).",
							   quote_identifier(user), object, cols);
	else if (cols != NULL)
		edata->hint = psprintf("Role %s may read only these columns of eventgrid.%s: %s; name them instead of *, or read it as a member of eventgrid_admin.",
							   quote_identifier(user), object, cols);
	else if (admin)
	{
		/* what a member of eventgrid_admin may not do: read secrets, write tables directly */
		static const char *const masked[][2] = {
			{"delivery_properties", "event_subscription_delivery_properties"},
			{"signing_secrets", "event_subscription_signing"},
			{"endpoint_validations", "event_subscription_validation"},
			{"client_certificates", "event_subscription_certificates"},
			{"delivery_authentications", "event_subscription_authentication"},
		};

		for (int i = 0; i < (int) lengthof(masked) && edata->hint == NULL; i++)
			if (strcmp(object, masked[i][0]) == 0)
				edata->hint = psprintf("eventgrid.%s holds secrets and is readable only by the extension's owner; read eventgrid.%s, which shows them masked.",
									   masked[i][0], masked[i][1]);
		if (edata->hint == NULL)
			edata->hint = pstrdup("Members of eventgrid_admin change eventgrid's tables through its functions (create_topic(), create_event_subscription(), ...), not directly; only dead_letters, rejected_events and dead_letter_notification_failures may be deleted from.");
	}
	else
		edata->hint = psprintf("Configuring eventgrid and reading its tables, statistics and dead letters requires the role eventgrid_admin: GRANT eventgrid_admin TO %s;",
							   quote_identifier(user));
}
