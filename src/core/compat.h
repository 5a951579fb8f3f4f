/*
 * compat.h - the one place where eventgrid's C differs by PostgreSQL major
 * (README "Supported PostgreSQL versions"; docs/SPEC.md section 15).  Each
 * wrapper is named for what it does and sits under a PG_VERSION_NUM guard
 * naming the release that changed the server's interface; the rest of src/
 * calls the wrapper and never tests the version itself.  Tested on 15, 17
 * and 18; the 14 and 16 branches follow those releases' notes and headers
 * and are untested.  Nothing here depends on a minor release.
 */
#ifndef EG_COMPAT_H
#define EG_COMPAT_H

#include "postgres.h"

#include "catalog/pg_database.h"
#include "common/base64.h"
#include "funcapi.h"
#if PG_VERSION_NUM >= 150000
#include "common/pg_prng.h"
#endif
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/tuplestore.h"

/*
 * A function that does not return: 18 replaced pg_attribute_noreturn()
 * (after the declarator) by pg_noreturn (before the declaration, C11's
 * _Noreturn).  Before 18 the compiler's attribute, which GCC and Clang also
 * take before the declaration.  Use: "pg_noreturn extern void f(void);".
 */
#ifndef pg_noreturn
#define pg_noreturn pg_attribute_noreturn()
#endif

/*
 * Base64 of len bytes at src into dst (at most dstlen): the length written,
 * or -1.  18 takes the bytes as uint8; 14-17 as char.
 */
static inline int
eg_b64_encode(const uint8 *src, int len, char *dst, int dstlen)
{
#if PG_VERSION_NUM >= 180000
	return pg_b64_encode(src, len, dst, dstlen);
#else
	return pg_b64_encode((const char *) src, len, dst, dstlen);
#endif
}

/*
 * The bytes of the base64 text src[0..len) into dst (at most dstlen): how
 * many, or -1 when src is not base64.  18 gives the bytes as uint8; 14-17
 * as char.
 */
static inline int
eg_b64_decode(const char *src, int len, uint8 *dst, int dstlen)
{
#if PG_VERSION_NUM >= 180000
	return pg_b64_decode(src, len, dst, dstlen);
#else
	return pg_b64_decode(src, len, (char *) dst, dstlen);
#endif
}

/*
 * A WaitEventSet for nevents events, living as long as the process (the
 * caller never frees it).  17 tracks a set by resource owner (NULL: none);
 * 14-16 allocate it in a memory context.  The caller includes
 * storage/latch.h.
 */
#if PG_VERSION_NUM >= 170000
#define eg_wait_event_set_create(nevents) CreateWaitEventSet(NULL, (nevents))
#else
#define eg_wait_event_set_create(nevents) CreateWaitEventSet(TopMemoryContext, (nevents))
#endif

/*
 * Inserts the index entries of a new row (slot) of rri's relation, as an
 * INSERT without ON CONFLICT does.  16 added onlySummarizing (false: every
 * index, the row being new); 14 and 15 take seven arguments.  The caller
 * includes executor/executor.h.
 */
#if PG_VERSION_NUM >= 160000
#define ExecInsertIndexTuplesCompat(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL, false)
#else
#define ExecInsertIndexTuplesCompat(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL)
#endif

/*
 * Makes request() run when the library may ask for shared memory: 15 added
 * shmem_request_hook (and refuses requests made elsewhere); 14 takes them in
 * _PG_init, so request() runs at once.  *prev gets the hook replaced (NULL
 * on 14), which request() calls first.  Called from _PG_init.
 */
static inline void
eg_shmem_request_hook_install(void (*request) (void), void (**prev) (void))
{
#if PG_VERSION_NUM >= 150000
	*prev = shmem_request_hook;
	shmem_request_hook = request;
#else
	*prev = NULL;
	request();
#endif
}

/*
 * Refuses placeholders of unknown GUCs under prefix (a typo such as
 * "eventgrid.delivery_worker"): 15 reserves the prefix; 14 only warns.
 */
#if PG_VERSION_NUM >= 150000
#define MarkGUCPrefixReservedCompat(prefix) MarkGUCPrefixReserved(prefix)
#else
#define MarkGUCPrefixReservedCompat(prefix) EmitWarningsOnPlaceholders(prefix)
#endif

/* Does role own database dboid?  16 replaced pg_database_ownercheck() by object_ownercheck(). */
static inline bool
eg_database_ownercheck(Oid dboid, Oid role)
{
#if PG_VERSION_NUM >= 160000
	return object_ownercheck(DatabaseRelationId, dboid, role);
#else
	return pg_database_ownercheck(dboid, role);
#endif
}

/* The local transaction id of proc: 17 moved it into proc->vxid. */
#if PG_VERSION_NUM >= 170000
#define eg_proc_lxid(proc) ((proc)->vxid.lxid)
#else
#define eg_proc_lxid(proc) ((proc)->lxid)
#endif

/*
 * A random fraction in [0, 1) from the backend's own generator: 15 added
 * pg_prng; 14 has random(), seeded per backend.
 */
static inline double
eg_random_fraction(void)
{
#if PG_VERSION_NUM >= 150000
	return pg_prng_double(&pg_global_prng_state);
#else
	return (double) random() / ((double) PG_INT32_MAX + 1);	/* random(): 0 .. 2^31 - 1 */
#endif
}

/*
 * Sets a set-returning function up to return its rows in a tuplestore
 * (rsinfo->setResult, with setDesc its result type).  15.0 named it
 * SetSingleFuncCall(), 15.1 InitMaterializedSRF() (the old name was kept in
 * 15 only); 14 has neither, and takes the materialize-mode steps its
 * documentation gives (xfunc-c, "Returning Sets") here.
 */
#if PG_VERSION_NUM >= 150001
#define eg_materialized_srf(fcinfo) InitMaterializedSRF((fcinfo), 0)
#elif PG_VERSION_NUM >= 150000
#define eg_materialized_srf(fcinfo) SetSingleFuncCall((fcinfo), 0)
#else
static inline void
eg_materialized_srf(FunctionCallInfo fcinfo)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	tupdesc;
	MemoryContext old;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) || (rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = tuplestore_begin_heap(true, false, work_mem);
	rsinfo->setDesc = CreateTupleDescCopy(tupdesc);
	MemoryContextSwitchTo(old);
}
#endif

/*
 * Makes this session's transactions record their progress in replication
 * origin node (a WAL source's, publish/wal_source_worker.c): 16 added who
 * may share it (0: this process alone).
 */
#if PG_VERSION_NUM >= 160000
#define eg_replorigin_session_setup(node) replorigin_session_setup((node), 0)
#else
#define eg_replorigin_session_setup(node) replorigin_session_setup(node)
#endif

#endif							/* EG_COMPAT_H */
