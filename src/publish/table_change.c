/*
 * table_change.c - the C edges of table change publications (SPEC section
 * 10): the entry points publish_table_changes() and
 * stop_publishing_table_changes(), and the ddl_command_end event trigger
 * that keeps publications right when their tables change.
 *
 * Whose privileges: the entry points are not SECURITY DEFINER.  They read
 * the role current where they are called (GetUserId(): inside someone's
 * SECURITY DEFINER function that function's owner, in an index expression
 * the table's owner) and pass it to the privileged part, a SECURITY
 * DEFINER function only the extension's owner may execute, which checks
 * that role's privileges on the table.  A role that merely runs such code
 * lends it nothing: neither the session user nor a SET ROLE role is
 * consulted.  Security-restricted operations (ANALYZE, VACUUM, REFRESH
 * MATERIALIZED VIEW and CREATE INDEX running index expressions) may not
 * publish at all.
 *
 * The event trigger reads the statement itself: a RENAME COLUMN renames the
 * column in the publications' lists (old and new name come from the
 * statement, so nothing has to guess which column became which), a DROP
 * COLUMN removes it from them, and a partition created with PARTITION OF
 * or attached below a published table gets the publication's triggers,
 * while a detached one loses them.
 */
#include "core/eventgrid.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/event_trigger.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "parser/parse_func.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

/*
 * Calls eventgrid.<name>(args...), a privileged part, through fmgr: no
 * EXECUTE check applies (the caller may not execute it from SQL) and, as
 * SECURITY DEFINER, it runs as its owner.  nulls: 'n' for a NULL argument.
 */
static void
call_privileged(const char *name, int nargs, const Oid *types, const Datum *values, const char *nulls)
{
	List	   *fname = list_make2(makeString("eventgrid"), makeString(pstrdup(name)));
	Oid			fn = LookupFuncName(fname, nargs, types, false);
	FmgrInfo	flinfo;

	LOCAL_FCINFO(fcinfo, FUNC_MAX_ARGS);

	fmgr_info(fn, &flinfo);
	InitFunctionCallInfoData(*fcinfo, &flinfo, nargs, InvalidOid, NULL, NULL);
	for (int i = 0; i < nargs; i++)
	{
		fcinfo->args[i].value = values[i];
		fcinfo->args[i].isnull = nulls != NULL && nulls[i] == 'n';
	}
	(void) FunctionCallInvoke(fcinfo);
}

/*
 * Calls the privileged part of an entry point with the role current at the
 * call first, then the entry point's own arguments (of the entry point's
 * declared types).
 */
static void
call_for_caller(FunctionCallInfo fcinfo, const char *what, const char *privileged)
{
	Oid			types[FUNC_MAX_ARGS];
	Datum		values[FUNC_MAX_ARGS];
	char		nulls[FUNC_MAX_ARGS];
	HeapTuple	proc;
	Form_pg_proc form;
	int			nargs = PG_NARGS();

	if (InSecurityRestrictedOperation())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("cannot %s during a security-restricted operation", what),
				 errdetail("An index expression, ANALYZE, VACUUM, CREATE INDEX or REFRESH MATERIALIZED VIEW called it."),
				 errhint("Call eventgrid.%s() directly, as the role that may publish the table.",
						 get_func_name(fcinfo->flinfo->fn_oid))));

	proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
	if (!HeapTupleIsValid(proc))
		elog(ERROR, "eventgrid: cache lookup failed for function %u", fcinfo->flinfo->fn_oid);
	form = (Form_pg_proc) GETSTRUCT(proc);
	types[0] = REGROLEOID;
	values[0] = ObjectIdGetDatum(GetUserId());
	nulls[0] = ' ';
	for (int i = 0; i < nargs; i++)
	{
		types[i + 1] = form->proargtypes.values[i];
		values[i + 1] = PG_GETARG_DATUM(i);
		nulls[i + 1] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	ReleaseSysCache(proc);
	call_privileged(privileged, nargs + 1, types, values, nulls);
}

PG_FUNCTION_INFO_V1(eventgrid_publish_table_changes);

/*
 * SQL: eventgrid.publish_table_changes(source_table, topic, operations,
 * columns, update_columns, event_type_prefix): publishes a table's
 * changes to a topic, with the privileges of the role current at the call
 * (eventgrid._publish_table_changes() checks them).  Errors: 42501 during a
 * security-restricted operation, and those of the privileged part.
 */
Datum
eventgrid_publish_table_changes(PG_FUNCTION_ARGS)
{
	call_for_caller(fcinfo, "publish table changes", "_publish_table_changes");
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(eventgrid_stop_publishing_table_changes);

/*
 * SQL: eventgrid.stop_publishing_table_changes(source_table, topic), with
 * the privileges of the role current at the call.
 */
Datum
eventgrid_stop_publishing_table_changes(PG_FUNCTION_ARGS)
{
	call_for_caller(fcinfo, "stop publishing table changes", "_stop_publishing_table_changes");
	PG_RETURN_VOID();
}

/* Calls eventgrid.<name>(rel) for a table DDL followed. */
static void
call_for_table(const char *name, Oid rel)
{
	Oid			type = REGCLASSOID;
	Datum		value = ObjectIdGetDatum(rel);

	call_privileged(name, 1, &type, &value, NULL);
}

PG_FUNCTION_INFO_V1(eventgrid_table_ddl);

/*
 * SQL: eventgrid._table_ddl(), the ddl_command_end event trigger function
 * for CREATE TABLE and ALTER TABLE (the header of this file says what it
 * follows).  Relations are looked up by the statement's names, now that
 * the statement has run: a rename or a drop that reached no publication
 * changes nothing.
 */
Datum
eventgrid_table_ddl(PG_FUNCTION_ARGS)
{
	EventTriggerData *trig;
	Node	   *stmt;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		elog(ERROR, "eventgrid: _table_ddl() is an event trigger function");
	trig = (EventTriggerData *) fcinfo->context;
	stmt = trig->parsetree;

	if (IsA(stmt, RenameStmt) && ((RenameStmt *) stmt)->renameType == OBJECT_COLUMN &&
		((RenameStmt *) stmt)->relation != NULL)
	{
		RenameStmt *rs = (RenameStmt *) stmt;
		Oid			rel = RangeVarGetRelid(rs->relation, NoLock, true);
		Oid			types[4] = {REGCLASSOID, BOOLOID, TEXTOID, TEXTOID};
		Datum		values[4];

		if (!OidIsValid(rel))
			PG_RETURN_VOID();
		values[0] = ObjectIdGetDatum(rel);
		values[1] = BoolGetDatum(rs->relation->inh);
		values[2] = CStringGetTextDatum(rs->subname);
		values[3] = CStringGetTextDatum(rs->newname);
		call_privileged("_rename_published_column", 4, types, values, NULL);
	}
	else if (IsA(stmt, CreateStmt) && ((CreateStmt *) stmt)->partbound != NULL)
	{
		Oid			rel = RangeVarGetRelid(((CreateStmt *) stmt)->relation, NoLock, true);

		if (OidIsValid(rel))
			call_for_table("_cover_partitions", rel);
	}
	else if (IsA(stmt, AlterTableStmt))
	{
		AlterTableStmt *at = (AlterTableStmt *) stmt;
		Oid			rel = RangeVarGetRelid(at->relation, NoLock, true);
		ListCell   *lc;

		if (!OidIsValid(rel))
			PG_RETURN_VOID();
		foreach(lc, at->cmds)
		{
			AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

			if (cmd->subtype == AT_DropColumn)
				call_for_table("_forget_dropped_columns", rel);
			else if (cmd->subtype == AT_AttachPartition || cmd->subtype == AT_DetachPartition)
			{
				PartitionCmd *pc = (PartitionCmd *) cmd->def;
				Oid			part = RangeVarGetRelid(pc->name, NoLock, true);

				if (OidIsValid(part))
					call_for_table(cmd->subtype == AT_AttachPartition ? "_cover_partitions" : "_uncover_partitions",
								   part);
			}
		}
	}
	PG_RETURN_VOID();
}
