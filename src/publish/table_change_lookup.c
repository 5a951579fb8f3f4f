/*
 * table_change_lookup.c - the publication a table change trigger publishes
 * for (table_change_trigger.c): looked up with one prepared query, its row
 * kept for the session's next statements until the publications, the
 * relation or a schema change.
 */
#include "publish/table_change.h"
#include "publish/publish.h"
#include "store/store.h"
#include "http/url.h"

#include "access/htup_details.h"
#include "access/heapam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/partition.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/xid8.h"

/*
 * The publications to the trigger's topic of its relation and of the
 * tables above it (a partition is covered by its nearest published
 * ancestor), with the names the events carry.  A plain prepared query: no
 * SQL function to plan again at each statement.
 */
static SPIPlanPtr lookup_plan = NULL;
static const char *lookup_sql =
"SELECT p.operations, p.columns, p.update_columns, p.event_type_prefix, t.input_schema, n.nspname::pg_catalog.text,"
"       c.relname::pg_catalog.text,"
"       ARRAY(SELECT a.attname::pg_catalog.text FROM pg_catalog.pg_index x,"
"                    pg_catalog.unnest(x.indkey) WITH ORDINALITY k(attnum, i), pg_catalog.pg_attribute a"
"              WHERE x.indrelid OPERATOR(pg_catalog.=) p.source_table AND x.indisprimary"
"                AND a.attrelid OPERATOR(pg_catalog.=) p.source_table AND a.attnum OPERATOR(pg_catalog.=) k.attnum"
"              ORDER BY k.i),"
"       p.source_table::pg_catalog.oid, eventgrid._table_change_trigger_name($2, $3)"
"  FROM eventgrid.table_publications p"
"  JOIN eventgrid.topics t ON t.name OPERATOR(pg_catalog.=) p.topic"
"  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.source_table"
"  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace"
" WHERE p.source_table::pg_catalog.oid OPERATOR(pg_catalog.=) ANY ($1) AND p.topic OPERATOR(pg_catalog.=) $2";

/*
 * What the lookup found, kept per backend for the next statements on the
 * same relation, topic and operation: the publication's row (with the
 * names of the published table and its primary key's columns).  Dropped
 * when eventgrid.table_publications changes (eg_publications_generation():
 * a statement trigger on it), when the relation or the published table
 * is invalidated in the relation cache (ALTER TABLE, a rename, a new
 * primary key, ANALYZE) and when any schema changes (its name is in the
 * events).
 */
#define EG_TC_KEPT 16
typedef struct EgKeptPublication
{
	bool		used;
	bool		stale;			/* invalidated: freed at the next look-up, not in the callback */
	Oid			relid;			/* the relation written */
	Oid			source;			/* the published table (relid or an ancestor) */
	char		topic[NAMEDATALEN * 2];
	char		operation[8];
	uint64		generation;
	HeapTuple	row;			/* the lookup's row, in TopMemoryContext */
	TupleDesc	desc;
} EgKeptPublication;

static EgKeptPublication kept[EG_TC_KEPT];
static int	kept_next = 0;		/* the entry replaced next when all are used */
static bool kept_callbacks = false;

static void
forget_kept(EgKeptPublication *k)
{
	if (!k->used)
		return;
	heap_freetuple(k->row);
	FreeTupleDesc(k->desc);
	k->used = false;
}

/*
 * A relation changed (InvalidOid: any): the publications kept for it are
 * marked stale.  Not freed here: invalidations are taken in the middle of
 * a statement (at a lock), perhaps while the trigger reads that row.
 */
static void
kept_relcache_callback(Datum arg, Oid relid)
{
	for (int i = 0; i < EG_TC_KEPT; i++)
		if (kept[i].used && (relid == InvalidOid || kept[i].relid == relid || kept[i].source == relid))
			kept[i].stale = true;
}

/* A schema changed: every kept publication is forgotten (the events carry schema names). */
static void
kept_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	kept_relcache_callback(arg, InvalidOid);
}

static EgKeptPublication *
find_kept(Oid relid, const char *topic, const char *operation)
{
	uint64		generation = eg_publications_generation();

	for (int i = 0; i < EG_TC_KEPT; i++)
	{
		EgKeptPublication *k = &kept[i];

		if (k->used && (k->stale || k->generation != generation))
			forget_kept(k);
		if (!k->used || k->relid != relid || strcmp(k->topic, topic) != 0 || strcmp(k->operation, operation) != 0)
			continue;
		return k;
	}
	return NULL;
}

/* Keeps the lookup's row for relid's statements to come, when it fits. */
static EgKeptPublication *
keep(Oid relid, Oid source, const char *topic, const char *operation, uint64 generation, HeapTuple row,
	 TupleDesc desc)
{
	EgKeptPublication *k;
	MemoryContext old;

	if (strlen(topic) >= sizeof(kept[0].topic))
		return NULL;
	if (!kept_callbacks)
	{
		CacheRegisterRelcacheCallback(kept_relcache_callback, (Datum) 0);
		CacheRegisterSyscacheCallback(NAMESPACEOID, kept_syscache_callback, (Datum) 0);
		kept_callbacks = true;
	}
	k = &kept[kept_next];
	kept_next = (kept_next + 1) % EG_TC_KEPT;
	forget_kept(k);
	old = MemoryContextSwitchTo(TopMemoryContext);
	k->row = heap_copytuple(row);
	k->desc = CreateTupleDescCopy(desc);
	MemoryContextSwitchTo(old);
	k->relid = relid;
	k->source = source;
	strlcpy(k->topic, topic, sizeof(k->topic));
	strlcpy(k->operation, operation, sizeof(k->operation));
	k->generation = generation;
	k->stale = false;
	k->used = true;
	return k;
}

/* The place of oid in list (which holds it). */
static int
list_oid_position(List *list, Oid oid)
{
	ListCell   *lc;

	foreach(lc, list)
		if (lfirst_oid(lc) == oid)
			return foreach_current_index(lc);
	return list_length(list);
}

/*
 * The publication of relation rel's changes to topic for operation: its
 * row (*desc: its columns: operations, columns, update_columns,
 * event_type_prefix, the topic's input schema, the published table's
 * schema and name, its primary key's columns, its oid, the trigger name
 * expected), of rel or of its nearest published ancestor (a partition is
 * covered by the tables above it); NULL when there is none.  Kept for the
 * session's next statements (see EgKeptPublication).  Runs in the
 * caller's SPI connection.
 */
HeapTuple
eg_tc_publication(Relation rel, const char *topic, const char *operation, TupleDesc *desc)
{
	Oid			relid = RelationGetRelid(rel);
	EgKeptPublication *kept_pub = find_kept(relid, topic, operation);
	Datum		args[3];
	Oid			types[3] = {OIDARRAYOID, TEXTOID, TEXTOID};
	List	   *ancestors;
	SPITupleTable *tt;
	HeapTuple	pubrow = NULL;
	bool		isnull;
	uint64		generation;
	int			best;

	if (kept_pub != NULL)
	{
		*desc = kept_pub->desc;
		return kept_pub->row;
	}
	generation = eg_publications_generation();
	if (lookup_plan == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(lookup_sql, 3, types);

		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "eventgrid: preparing the table change lookup failed");
		lookup_plan = plan;
	}
	/* the relation, then its ancestors, nearest first */
	ancestors = list_make1_oid(relid);
	if (rel->rd_rel->relispartition)
		ancestors = list_concat(ancestors, get_partition_ancestors(relid));
	{
		Datum	   *oids = palloc(list_length(ancestors) * sizeof(Datum));
		int			k = 0;
		ListCell   *lc;

		foreach(lc, ancestors)
			oids[k++] = ObjectIdGetDatum(lfirst_oid(lc));
		args[0] = PointerGetDatum(construct_array(oids, k, OIDOID, sizeof(Oid), true, TYPALIGN_INT));
	}
	args[1] = CStringGetTextDatum(topic);
	args[2] = CStringGetTextDatum(operation);
	/*
	 * Read under a snapshot taken now, after the generation: a row kept
	 * under this generation then holds every change that generation
	 * counts (the count moves after the change is visible).  The
	 * statement's or transaction's snapshot (REPEATABLE READ, SERIALIZABLE)
	 * may be older than a change the generation already counts: the row
	 * read under it would be kept as current for the session's life.
	 */
	pg_memory_barrier();
	PushActiveSnapshot(GetLatestSnapshot());
	if (SPI_execute_plan(lookup_plan, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "eventgrid: looking up the table change publication failed");
	PopActiveSnapshot();
	tt = SPI_tuptable;
	*desc = tt->tupdesc;
	best = list_length(ancestors);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		Oid			source = DatumGetObjectId(SPI_getbinval(tt->vals[r], *desc, 9, &isnull));
		int			depth = list_member_oid(ancestors, source) ? list_oid_position(ancestors, source) : best;

		if (depth < best)
		{
			best = depth;
			pubrow = tt->vals[r];
		}
	}
	/* kept only when the publications did not change meanwhile (read before the lookup) */
	if (pubrow != NULL && eg_shared != NULL)
		(void) keep(relid, DatumGetObjectId(SPI_getbinval(pubrow, *desc, 9, &isnull)),
					topic, operation, generation, pubrow, *desc);
	return pubrow;
}
