/*
 * queue_access.c - who may use a queue event subscription (SPEC 14:
 * eventgrid_receiver reaches every queue; grant_receive() names a role for
 * one subscription or a topic's), and acknowledge(), release(), reject()
 * and renew_locks(), which check it and then run their SQL bodies
 * (eventgrid._acknowledge() ...) as the extension's owner.
 */
#include "core/eventgrid.h"
#include "queue/queue.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
#include "utils/syscache.h"
#include "utils/tuplestore.h"

/* See queue.h. */
void
eg_queue_enter(EgQueueCaller *c, Oid fn_oid)
{
	HeapTuple	tp = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn_oid));
	Oid			owner;

	if (!HeapTupleIsValid(tp))
		elog(ERROR, "cache lookup failed for function %u", fn_oid);
	owner = ((Form_pg_proc) GETSTRUCT(tp))->proowner;
	ReleaseSysCache(tp);
	c->caller = GetUserId();
	GetUserIdAndSecContext(&c->saved_userid, &c->saved_sec_context);
	SetUserIdAndSecContext(owner, c->saved_sec_context | SECURITY_LOCAL_USERID_CHANGE);
}

/* See queue.h. */
void
eg_queue_leave(const EgQueueCaller *c)
{
	SetUserIdAndSecContext(c->saved_userid, c->saved_sec_context);
}

/* See queue.h. */
void
eg_queue_in_subxact(bool (*look) (void *arg), void *arg)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	volatile bool keep = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);
	PG_TRY();
	{
		keep = look(arg);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcontext);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
		edata->context = NULL;	/* the internal functions' lines are no concern of the caller's */
		ReThrowError(edata);
	}
	PG_END_TRY();
	if (keep)
		ReleaseCurrentSubTransaction();
	else
		RollbackAndReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(oldcontext);
	CurrentResourceOwner = oldowner;
}

typedef struct SubscriptionLookup
{
	Datum		args[3];
	int64		sid;
} SubscriptionLookup;

static bool
look_up_subscription(void *arg)
{
	SubscriptionLookup *l = arg;
	bool		isnull;

	if (SPI_execute_with_args("SELECT eventgrid._receive_subscription_id($1, $2, $3)", 3,
							  (Oid[]) {TEXTOID, TEXTOID, OIDOID}, l->args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up the queue subscription");
	l->sid = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_freetuptable(SPI_tuptable);
	return false;
}

/* See queue.h. */
int64
eg_queue_subscription_for(Datum topic, Datum subscription, Oid role)
{
	SubscriptionLookup l = {.args = {topic, subscription, ObjectIdGetDatum(role)}};

	eg_queue_in_subxact(look_up_subscription, &l);
	return l.sid;
}

PG_FUNCTION_INFO_V1(eventgrid_queue_settle);

/*
 * eventgrid.acknowledge(topic, subscription, lock_tokens),
 * release(topic, subscription, lock_tokens, release_delay),
 * reject(...) and renew_locks(...) -> (lock_token, succeeded, error): the
 * caller's right to the subscription checked (42501 without it), then
 * eventgrid._<name>(the same arguments), whose rows it returns, run as the
 * extension's owner.  Errors: those of eventgrid._<name> (22004, 22023,
 * 54000, 42704, 42809).
 */
Datum
eventgrid_queue_settle(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	const char *name = get_func_name(fcinfo->flinfo->fn_oid);
	int			nargs = PG_NARGS();
	Datum		args[4];
	char		nulls[4];
	Oid			types[4] = {TEXTOID, TEXTOID, TEXTARRAYOID, INT4OID};
	EgQueueCaller c;
	uint64		rows;
	MemoryContext cxt = CurrentMemoryContext;

	if (name == NULL || nargs < 3 || nargs > 4 ||
		!(strcmp(name, "acknowledge") == 0 || strcmp(name, "release") == 0 ||
		  strcmp(name, "reject") == 0 || strcmp(name, "renew_locks") == 0))
		elog(ERROR, "eventgrid_queue_settle called as an unknown function");
	for (int i = 0; i < nargs; i++)
	{
		args[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	eg_materialized_srf(fcinfo);
	eg_queue_enter(&c, fcinfo->flinfo->fn_oid);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	/* NULL names: the body says which must not be NULL */
	if (!PG_ARGISNULL(0) && !PG_ARGISNULL(1))
		(void) eg_queue_subscription_for(args[0], args[1], c.caller);
	PG_TRY();
	{
		if (SPI_execute_with_args(psprintf("SELECT t.lock_token, t.succeeded, t.error FROM eventgrid.%s(%s) t",
										   quote_identifier(psprintf("_%s", name)),
										   nargs == 3 ? "$1, $2, $3" : "$1, $2, $3, $4"),
								  nargs, types, args, nulls, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not settle the lock tokens");
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		edata->context = NULL;	/* the body's lines are no concern of the caller's */
		ReThrowError(edata);
	}
	PG_END_TRY();
	rows = SPI_processed;
	for (uint64 i = 0; i < rows; i++)
	{
		Datum		values[3];
		bool		isnull[3];

		for (int k = 0; k < 3; k++)
			values[k] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, k + 1, &isnull[k]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
	}
	SPI_finish();
	eg_queue_leave(&c);
	return (Datum) 0;
}
