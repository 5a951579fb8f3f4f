/*
 * table_change.h - what the three files of a table change publication's
 * trigger share (README "Publishing table changes"): table_change_trigger.c
 * (the statement trigger: rows paired, batches stored),
 * table_change_event.c (an event built from a row) and
 * table_change_lookup.c (the publication, looked up and kept).
 */
#ifndef EVENTGRID_TABLE_CHANGE_H
#define EVENTGRID_TABLE_CHANGE_H

#include "core/eventgrid.h"

#include "executor/tuptable.h"
#include "fmgr.h"
#include "utils/jsonb.h"
#include "utils/rel.h"

#define EG_TC_BATCH 1000		/* events stored at once */

typedef enum EgInputSchema
{
	IN_EVENTGRID,
	IN_CLOUDEVENTS,
	IN_CUSTOM
} EgInputSchema;

/*
 * How a column's value becomes JSON: the value to_jsonb() gives for a
 * built-in type (domains over one included), made here directly for the
 * commonest ones (what to_jsonb() makes of them: a number, true or false,
 * the string itself), through to_jsonb() for the others; the text form,
 * as a string, for a user-defined type.
 */
typedef enum EgValueKind
{
	VALUE_INTEGER,				/* int2, int4, int8: a number */
	VALUE_BOOL,					/* true or false */
	VALUE_TEXT,					/* text, varchar: the string */
	VALUE_TO_JSONB,				/* other built-in types: to_jsonb() */
	VALUE_TEXT_FORM				/* user-defined types: the output function's string */
} EgValueKind;

/* How one column of the written relation goes into events. */
typedef struct EgColumn
{
	AttrNumber	attnum;
	char	   *name;
	bool		published;		/* in the publication's columns */
	bool		watched;		/* in its update_columns: an UPDATE that changes none is no event */
	EgValueKind kind;
	Oid			base;			/* the base type (of a domain: the type under it) */
	FmgrInfo	to_jsonb;
	FmgrInfo	output;
} EgColumn;

/* What one statement publishes. */
typedef struct EgChange
{
	const char *topic;
	const char *operation;		/* INSERT, UPDATE, DELETE */
	EgInputSchema schema;
	char	   *schema_name;	/* of the published table */
	char	   *table_name;
	char	   *event_type;
	char	   *event_time;
	char	   *source;			/* CloudEvents: /postgresql/<database>/<schema>/<table> */
	char	   *head;			/* /<schema>/<table>, percent-encoded */
	EgColumn   *cols;
	int			ncols;
	AttrNumber *keys;			/* the primary key's columns, or NULL: the subject is head alone */
	int			nkeys;
	Datum		publish_time;
	/*
	 * Each event's size as JSON text (add_event): the text of the first
	 * event is made in full; the others are sized from its skeleton (what
	 * is the same in every event of the statement: keys, punctuation, the
	 * names and stamps) and the text of their own values.
	 */
	int64		skeleton_size;	/* -1 until the first event */
	int64		values_size;	/* of the event being built */
	const char *id;				/* the event's id, or NULL: a random UUID (a WAL source's are derived) */
	/* columns left out of the new and the old row being built (by attnum - 1), or NULL: none */
	const bool *absent_new;
	const bool *absent_old;
	StringInfoData text;		/* scratch for the text of one value */
	/* the batch being filled, its events in batch_cxt */
	Datum	   *events;
	Datum	   *sizes;
	int			n;
	MemoryContext batch_cxt;
	TupleTableSlot **slots;		/* for storing a batch: nslots made so far, as many as a batch needed */
	int			nslots;
	MemoryContext slot_cxt;		/* where they are made (NULL: the current context; a WAL source: the transaction's) */
	TupleDesc	slot_desc;		/* theirs: the event table's, copied */
} EgChange;

/* table_change_lookup.c */
extern HeapTuple eg_tc_publication(Relation rel, const char *topic, const char *operation, TupleDesc *desc);

/* table_change_event.c */
extern bool eg_tc_in_array(Datum array, bool isnull, const char *name);
extern char *eg_tc_rfc3339(TimestampTz ts);
extern AttrNumber eg_tc_column_number(TupleDesc desc, const char *name);
extern void eg_tc_prepare_columns(EgChange *c, TupleDesc desc, Datum columns, bool columns_null, Datum watched,
								  bool watched_null, Datum keys, bool keys_null);
extern bool eg_tc_unchanged(EgChange *c, TupleTableSlot *newslot, TupleTableSlot *oldslot, MemoryContext row_cxt);
extern Jsonb *eg_tc_build_event(EgChange *c, TupleTableSlot *newslot, TupleTableSlot *oldslot, int64 *size);

/* table_change_trigger.c: a batch of built events, stored as COPY stores rows */
extern void eg_tc_add_event(EgChange *c, TupleTableSlot *newslot, TupleTableSlot *oldslot, MemoryContext row_cxt);
extern void eg_tc_flush(EgChange *c);

#endif							/* EVENTGRID_TABLE_CHANGE_H */
