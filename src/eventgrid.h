/*
 * eventgrid.h - what every eventgrid C file shares: the contract's limits,
 * the GUC variables (module.c), the shared memory through which
 * publishers wake the delivery workers, the launcher tracks each
 * database's workers (databases.c) and the workers share rate buckets and
 * per-host request counts, and the background workers' entry points.  Each
 * concern has a header of its own: outcome.h (outcomes and the retry
 * schedule), store.h (the queue's SQL), http.h (requests and libcurl),
 * url.h (endpoint URLs), endpoint.h (host queues and endpoint health),
 * worker.h (what the delivery and upkeep workers share).
 */
#ifndef EVENTGRID_H
#define EVENTGRID_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "postmaster/bgworker.h"
#include "lib/stringinfo.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/spin.h"
#include "utils/jsonb.h"

/* SPEC section 3, 4, 5 and 8 limits. */
#define EG_MAX_EVENT_BYTES (1024 * 1024)
#define EG_MAX_DELIVERY_ATTEMPTS 30
#define EG_MAX_DELIVERY_COUNT 10	/* namespace topics */

/*
 * What a delivery worker holds per delivery in flight besides the event's
 * text, counted with it against eventgrid.max_bytes_in_flight: its claimed
 * row, delivery and request records and their strings (endpoint, names,
 * headers) took 1.3 kB in a claim's memory context, 2.3 kB with the
 * context's free space (pg_log_backend_memory_contexts, 16 subscriptions
 * draining, bench/RESULTS.md "Memory per subscription").
 */
#define EG_DELIVERY_OVERHEAD_BYTES 2048

/* Set by the Makefile from eventgrid.control; the workers compare it with the schema's. */
#ifndef EG_VERSION
#error "EG_VERSION must be defined"
#endif

/* GUCs (module.c) */
extern char *eg_database_name;	/* unused since 0.9.0: every database with the extension is served */
extern int	eg_max_databases;
extern int	eg_worker_idle_timeout_s;
extern int	eg_delivery_workers;
extern int	eg_max_concurrent_requests;
#define EG_MAX_CONCURRENT_REQUESTS_LIMIT 1000	/* upper bound of eventgrid.max_concurrent_requests */
extern int	eg_response_timeout_ms;
extern int	eg_retry_jitter_percent;
extern int	eg_max_retry_after_s;
extern int	eg_clock_offset_s;
extern int	eg_default_max_events_per_batch;
extern int	eg_default_preferred_batch_kb;
extern bool eg_delivery_paused;
extern int	eg_max_bytes_in_flight_kb;
extern int	eg_event_table_rotation_s;
extern int	eg_event_retention_s;	/* eventgrid.event_retention, seconds */
extern int	eg_replication_sync_wait_s;	/* eventgrid.replication_sync_wait, seconds */
extern int	eg_max_requests_per_endpoint;
extern int	eg_probation_failures;
extern int	eg_attempt_history;
extern int	eg_attempt_history_retention_s;
extern int	eg_attempt_history_max_rows;
extern char *eg_ssl_ca_file;
extern char *eg_webhook_request_origin;

/* eventgrid.attempt_history: which delivery attempts the history keeps. */
typedef enum EgHistoryMode
{
	EG_HISTORY_ALL,
	EG_HISTORY_FAILURES,
	EG_HISTORY_OFF
} EgHistoryMode;

/* Delivery attempt history: three tables that take turns (store_rotation.c). */
#define EG_HISTORY_TABLES 3

/* Published events go to three event tables that take turns (module.c). */
#define EG_EVENT_TABLES 3
extern int	eg_event_table_at(TimestampTz ts);
/* When event table k (not the current one at ts) last stopped taking new events. */
extern TimestampTz eg_event_table_turn_end(int k, TimestampTz ts);

/*
 * Most delivery workers eventgrid.delivery_workers may ask for, per
 * database.  Worker k (1 to eventgrid.delivery_workers) has entry k - 1 of
 * its database slot's arrays below; what it claims is leased to its pid
 * (lease_owner).
 */
#define EG_MAX_DELIVERY_WORKERS 8

/* Token buckets of rate-limited event subscriptions (rate.c), cluster-wide. */
#define EG_RATE_BUCKETS 4096
typedef struct EgRateBucket
{
	Oid			dboid;			/* with subscription_id, the key */
	int64		subscription_id;	/* 0: free */
	double		tokens;			/* events that may be claimed now */
	TimestampTz at;				/* when tokens was last brought up to date */
} EgRateBucket;

/*
 * Requests in flight to one endpoint host (scheme, host and port), from
 * every delivery worker of every database: eventgrid.max_requests_per_endpoint
 * bounds the sum (endpoint_queue.c).  Keyed by a 64-bit hash of the host
 * key; a slot whose count is 0 is free.
 */
#define EG_HOST_SLOTS 4096
typedef struct EgHostSlot
{
	uint64		hash;
	int32		in_flight;
} EgHostSlot;

/* What the launcher knows of a database (databases.c). */
typedef enum EgDbState
{
	EG_DB_FREE = 0,				/* the slot is unused */
	EG_DB_UNKNOWN,				/* a worker must connect to see whether the extension is there */
	EG_DB_ABSENT,				/* no eventgrid extension */
	EG_DB_OTHER_VERSION,		/* the extension, in another version than the library's */
	EG_DB_READY					/* the extension, in the library's version */
} EgDbState;

/*
 * One database the launcher knows (from pg_database), and its workers.  A
 * pid slot is set by the worker itself once it has registered the exit
 * callback that clears it, so it is non-zero exactly while that process
 * lives (a crash of any backend re-creates shared memory): the launcher and
 * the upkeep worker read liveness from the slots, never from kill(pid, 0),
 * which a reused pid would fool.  Everything here is under
 * eg_shared->mutex.
 */
typedef struct EgDbSlot
{
	Oid			dboid;			/* InvalidOid when the slot is free */
	NameData	name;			/* as pg_database last said */
	EgDbState	state;			/* as a worker last found it */
	bool		recheck;		/* the extension may have changed: a worker is to look again */
	bool		present;		/* seen by the launcher's last look at pg_database */
	TimestampTz delivery_at;	/* the delivery workers are wanted from then on, on the workers' clock
								 * (eg_now()) (0: now; DT_NOEND: not) */
	TimestampTz upkeep_at;		/* the upkeep worker likewise */
	uint64		wakes;			/* commits in the database that asked for delivery */
	pid_t		hold_pid;		/* a backend whose DDL needs the database to itself (0: none) */
	bool		leave;			/* the workers are to finish what they sent and exit */
	TimestampTz turn_since;		/* when its workers last started */
	TimestampTz waiting_since;	/* wanted, but a worker slot was not free (0: not waiting) */
	TimestampTz last_active;	/* when one of its workers last had work */
	Latch	   *worker_latch[EG_MAX_DELIVERY_WORKERS];	/* index: worker number - 1 */
	pid_t		worker_pid[EG_MAX_DELIVERY_WORKERS];
	pid_t		upkeep_pid;		/* the upkeep worker's */
	Latch	   *upkeep_latch;
	bool		clean_exit[EG_MAX_DELIVERY_WORKERS + 1];	/* the last process of each left on purpose ([0]: upkeep) */
	bool		upkeep_wanted;	/* a delivery worker had work since the last upkeep */
	int64		backlog;		/* deliveries ready and not claimed, as the upkeep worker last counted */
	TimestampTz summary_at;		/* the upkeep worker's last summary of dead letters (0: none yet) */
	int64		summary_dead_letter_id; /* the newest dead letter then (-1: no baseline yet) */
	int64		summary_dropped;	/* the dropped events counted then */
	uint64		change_generation;	/* counts commits that created, paused, resumed, updated or dropped event subscriptions */
	bool		no_subscriptions;	/* the upkeep worker found no event subscription (and none changed since):
									 * commits that publish wake no delivery worker */
} EgDbSlot;

/* Shared state: the launcher, the rate buckets, the hosts, and a slot per database. */
typedef struct EgShared
{
	slock_t		mutex;
	Latch	   *launcher_latch;
	pid_t		launcher_pid;
	bool		slots_short;	/* a database waits for a free worker slot: the others go as soon as they are idle */
	pg_atomic_uint64 publications_generation;	/* commits that changed eventgrid.table_publications, anywhere */
	EgRateBucket rate[EG_RATE_BUCKETS];
	EgHostSlot	hosts[EG_HOST_SLOTS];
	int			ndb;			/* eventgrid.max_databases */
	EgDbSlot	db[FLEXIBLE_ARRAY_MEMBER];
} EgShared;

extern EgShared *eg_shared;

/*
 * The slot of the database this process is connected to, in a delivery or
 * upkeep worker (set at its start); NULL elsewhere.
 */
extern EgDbSlot *eg_my_db;

/* In a worker, the name of its database, which every line it logs names (module.c's log hook). */
extern const char *eg_log_database;

/*
 * Entry points.  The launcher (launcher.c) is registered from _PG_init; it
 * finds the databases that have the extension and starts their delivery
 * workers (delivery_worker.c) and upkeep worker (upkeep_worker.c) when
 * they have work, restarting each with backoff when it fails.
 */
extern PGDLLEXPORT void eventgrid_launcher_main(Datum arg);
extern PGDLLEXPORT void eventgrid_worker_main(Datum arg);
extern PGDLLEXPORT void eventgrid_upkeep_main(Datum arg);

/*
 * Describes one of eventgrid's dynamic background workers: entry point
 * function, type "eventgrid <type>", database dboid (named dbname in its
 * name), worker number (1 to eventgrid.delivery_workers; 0 for the upkeep
 * worker, in bgw_extra), not restarted by the postmaster, reporting start
 * and exit to this process.
 */
extern void eg_worker_spec(BackgroundWorker *worker, const char *function, const char *type, Oid dboid,
						   const char *dbname, int number);

/*
 * databases.c: the database slots.  eg_db_wake() is what a commit that
 * published (or changed what the workers do) calls: the database's
 * delivery workers are woken, or, when none runs, the launcher starts them.
 */
extern Size eg_shared_size(void);
extern void eg_shared_init(void);
extern EgDbSlot *eg_db_find(Oid dboid, bool create);
extern void eg_db_wake(Oid dboid, bool delivery, bool upkeep);
/* A commit published events in database dboid: eg_db_wake() of both, no delivery worker while it has no event subscription. */
extern void eg_db_wake_for_events(Oid dboid);
extern void eg_db_extension_changed(Oid dboid);
extern void eg_db_hold_for_ddl(Oid dboid);
extern void eg_db_release_holds(bool dropped);
extern void eg_db_want(EgDbSlot *db, bool upkeep, TimestampTz at);
extern bool eg_db_leaving(void);
extern void eg_wake_launcher(void);

/* Wakes every delivery worker of this process's database now (no-op for those not running). */
extern void eg_wake_worker(void);

/* Wakes the delivery workers once when the current transaction commits (module.c). */
extern void eg_wake_worker_at_commit(void);
/* Likewise for a transaction that publishes events: no delivery worker while the database has no event subscription. */
extern void eg_wake_for_events_at_commit(void);

/*
 * Table change publications (module.c): a counter that moves when a commit
 * changed eventgrid.table_publications (in any database) or this backend
 * changed it (at once), so that table_change_trigger.c knows when what it
 * keeps of them is stale.
 */
extern uint64 eg_publications_generation(void);

/* Tells the upkeep worker of this process's database that work came in: upkeep within a second. */
extern void eg_want_upkeep(void);

/* Current time as the worker sees it: real time plus eventgrid.clock_offset. */
extern TimestampTz eg_now(void);
extern TimestampTz eg_transaction_now(void);

/* publish.c: an event's size as JSON text (what the 1 MB limit applies to), and that limit */
extern int64 eg_event_text_size(Jsonb *jb);
/* publish.c: does this database have topic (eventgrid.topics, through SPI)? */
extern bool eg_topic_exists(const char *topic);
/* publish.c: the current local transaction id (MyProc's), to tell one transaction's calls from the next's */
extern LocalTransactionId eg_current_lxid(void);
extern void eg_check_event_size(int64 size);

/*
 * Runs work(arg) in a subtransaction of the current transaction (store.c):
 * NULL when it returned, else the ERROR it raised, copied into the
 * caller's memory context, the subtransaction rolled back and the error
 * dropped; the caller's memory context and resource owner are kept.
 */
extern ErrorData *eg_try(void (*work) (void *arg), void *arg);

/*
 * An event that logical replication brought for topic (topic_known: this
 * database has it), checked as a publish into it would check it (publish.c):
 * NULL when valid, with *stored the event as it is kept (stamped) and
 * *size its JSON text's size (recomputed, whatever was sent); else why
 * not, palloc'd (the error a publish would have raised).  Never raises for
 * an invalid event.
 */
extern char *eg_check_replicated_event(const char *topic, bool topic_known, Jsonb *jb, Jsonb **stored,
									   int64 *size);
/* replication.c: eventgrid.events_id_seq's OID (event ids), kept for the backend's life */
extern Oid	eg_event_id_sequence(void);

#endif							/* EVENTGRID_H */
