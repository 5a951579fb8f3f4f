/*
 * wal_source.h - WAL sources (SPEC 19, README "Events from managed
 * PostgreSQL"): a background worker per source reads another server's
 * write-ahead log through a logical replication slot (pgoutput, over
 * libpq's replication connection) and publishes here what it finds:
 * pg_logical_emit_message() messages with the source's prefix, and the
 * changes of mapped tables.  wal_source_worker.c runs the connection and
 * the stream, wal_source_decode.c turns pgoutput's messages into events,
 * wal_source_backfill.c publishes the rows the tables held before the
 * stream (backfill), wal_source_functions.c holds the SQL-callable helpers.
 */
#ifndef EVENTGRID_WAL_SOURCE_H
#define EVENTGRID_WAL_SOURCE_H

#include "core/eventgrid.h"

#include "access/xlogdefs.h"
#include "libpq-fe.h"
#include "lib/stringinfo.h"
#include "replication/logicalproto.h"

/*
 * The advisory lock (two keys: this class, the source's id) a source's
 * worker holds for its whole life: one worker per source, and how the
 * upkeep worker and drop_wal_source() find it.
 */
#define EG_WAL_SOURCE_LOCK_CLASS 1162302291

/* The replication origin of source id ("eventgrid_wal_source_<id>") into buf. */
#define EG_WAL_ORIGIN_NAME_LEN 64
extern void eg_wal_origin_name(int64 id, char *buf);

/* What a source's transaction being read has made so far (wal_source_decode.c). */
typedef struct EgWalTxn
{
	XLogRecPtr	commit_lsn;		/* the source's commit record (from BEGIN) */
	TimestampTz commit_time;
	int			changes;		/* row changes the source sent for it so far */
	bool		local_open;		/* a transaction here holds its events */
	XLogRecPtr	local_end;		/* the end of its commit here (InvalidXLogRecPtr: none yet) */
	int64		events;			/* events stored */
	int64		rejects;		/* rows written to wal_source_rejects */
} EgWalTxn;

/* One source being read (wal_source_worker.c sets it up). */
typedef struct EgWalSource
{
	int64		id;
	char	   *name;
	char	   *message_prefix;
	char	   *system_identifier;	/* the source's, for events' ids */
	char	   *database;		/* the source's database name, for CloudEvents' source */
	char	   *slot;			/* the replication slot read on the source */
	const char *state;			/* what its unit of work reports: backfilling, streaming */
	EgWalTxn	txn;
	bool		in_txn;			/* between BEGIN and COMMIT */
} EgWalSource;

/*
 * wal_source_decode.c: applies one pgoutput message (a logical replication
 * protocol message after its XLogData header) of source src; returns the
 * end LSN of a source transaction it committed here (COMMIT), else
 * InvalidXLogRecPtr.  Each source transaction's events and rejects are
 * committed in one transaction here, with the replication origin's
 * progress (the session's origin must be set up).
 */
extern XLogRecPtr eg_wal_apply(EgWalSource *src, StringInfo msg);
/* Forgets the relations the stream described (a new connection describes them again). */
extern void eg_wal_reset_relations(void);

/*
 * wal_source_decode.c, for the backfill: describes a table read by query
 * (as the stream's 'R' message does: relid a number the stream does not
 * use, the columns' names and type OIDs, keys the primary key's columns by
 * index); publishes one row of it as a BACKFILL event of the mapping to
 * topic, with the given id; writes a reject; and commits what was
 * published (no replication origin progress: the backfill is before it).
 * The row's text values are in row (LOGICALREP_COLUMN_TEXT or _NULL).
 */
extern void eg_wal_describe_table(EgWalSource *src, uint32 relid, const char *nspname, const char *relname,
								  int natts, char **attnames, Oid *atttyps, Bitmapset *keys);
extern void eg_wal_backfill_row(EgWalSource *src, uint32 relid, const char *topic,
								LogicalRepTupleData *row, const char *id);
extern void eg_wal_reject(EgWalSource *src, const char *reason, const char *content, int len, bool in_txn);
/* Opens the transaction here that eg_wal_commit_backfill() commits, if nothing did yet. */
extern void eg_wal_open(EgWalSource *src);
extern void eg_wal_commit_backfill(EgWalSource *src);
/* A UUID (version 3 layout, of MD5) derived from key: the ids of a source's table changes and backfilled rows. */
extern char *eg_wal_uuid(const char *key);

/*
 * wal_source_backfill.c: whether source id has tables left to backfill
 * (in a unit of work); and the backfill itself, on the source's
 * replication connection inside the repeatable read transaction that holds
 * the snapshot to read (the slot's, or a new one after a restart).  Each
 * chunk of rows is one transaction here with the table's progress.
 */
extern bool eg_wal_backfill_pending(int64 id);
/* Before the slot is made: an ERROR (with the GRANT to run) when the source's role may not read a table to backfill. */
extern void eg_wal_backfill_check(EgWalSource *src);
extern void eg_wal_backfill(EgWalSource *src);

/*
 * wal_source_worker.c: opens a unit of work (eg_store_begin(), committed by
 * eg_store_commit()); when the extension is missing or of another version
 * than the library, the worker leaves instead.
 */
extern void eg_wal_begin(const char *activity);
/*
 * wal_source_worker.c: runs one command on the source's connection
 * (interruptible); its last result, of status expected (else an ERROR),
 * which the caller clears.
 */
extern PGresult *eg_wal_source_exec(EgWalSource *src, const char *sql, ExecStatusType expected);
/* wal_source_worker.c: the upkeep worker starts a worker for each unpaused source that has none */
extern void eg_wal_sources_start(void);

#endif							/* EVENTGRID_WAL_SOURCE_H */
