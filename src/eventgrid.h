/*
 * eventgrid.h - what every eventgrid C file shares: the contract's limits,
 * the GUC variables (module.c), the small shared-memory block through
 * which publishers wake the delivery workers and the launcher tracks the
 * workers it started, and the background workers' entry points.  Each
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
#include "storage/latch.h"
#include "storage/spin.h"

/* SPEC section 3, 4, 5 and 8 limits. */
#define EG_MAX_EVENT_BYTES (1024 * 1024)
#define EG_MAX_DELIVERY_ATTEMPTS 30
#define EG_MAX_DELIVERY_COUNT 10	/* namespace topics */

/* Set by the Makefile from eventgrid.control; the workers compare it with the schema's. */
#ifndef EG_VERSION
#error "EG_VERSION must be defined"
#endif

/* GUCs (module.c) */
extern char *eg_database_name;
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

/*
 * Most delivery workers eventgrid.delivery_workers may ask for.  Worker k
 * (1 to eventgrid.delivery_workers) has entry k - 1 of the arrays below;
 * what it claims is leased to its pid (lease_owner).
 */
#define EG_MAX_DELIVERY_WORKERS 8

/* Token buckets of rate-limited event subscriptions (rate.c). */
#define EG_RATE_BUCKETS 1024
typedef struct EgRateBucket
{
	int64		subscription_id;	/* 0: free */
	double		tokens;			/* events that may be claimed now */
	TimestampTz at;				/* when tokens was last brought up to date */
} EgRateBucket;

/*
 * Shared state.  A pid slot is set by the worker itself once it has
 * registered the exit callback that clears it, so a slot is non-zero
 * exactly while that process lives (a crash of any backend re-creates
 * shared memory): the launcher and the upkeep worker read liveness from the
 * slots, never from kill(pid, 0), which a reused pid would fool.
 */
typedef struct EgShared
{
	slock_t		mutex;
	Latch	   *worker_latch[EG_MAX_DELIVERY_WORKERS];	/* index: worker number - 1 */
	pid_t		worker_pid[EG_MAX_DELIVERY_WORKERS];
	pid_t		upkeep_pid;		/* the upkeep worker's */
	bool		upkeep_wanted;	/* a delivery worker had work since the last upkeep */
	int64		backlog;		/* deliveries ready and not claimed, as the upkeep worker last counted */
	uint64		change_generation;	/* counts commits that paused, resumed, updated or dropped event subscriptions */
	EgRateBucket rate[EG_RATE_BUCKETS]; /* under mutex */
} EgShared;

extern EgShared *eg_shared;

/*
 * Entry points.  The launcher (launcher.c) is registered from _PG_init; it
 * waits for eventgrid.database_name to exist and starts the delivery
 * workers (delivery_worker.c) and the upkeep worker (upkeep_worker.c)
 * there, restarting each with backoff when it exits.
 */
extern PGDLLEXPORT void eventgrid_launcher_main(Datum arg);
extern PGDLLEXPORT void eventgrid_worker_main(Datum arg);
extern PGDLLEXPORT void eventgrid_upkeep_main(Datum arg);

/*
 * Describes one of eventgrid's dynamic background workers: entry point
 * function, type (also its name) "eventgrid <type>", database dboid, worker
 * number (1 to eventgrid.delivery_workers; 0 for the upkeep worker, in
 * bgw_extra), not restarted by the postmaster, reporting start and exit to
 * this process.
 */
extern void eg_worker_spec(BackgroundWorker *worker, const char *function, const char *type, Oid dboid,
						   int number);

/* Wakes every delivery worker now (no-op for those not running). */
extern void eg_wake_worker(void);

/* Tells the upkeep worker that work came in: upkeep within a second. */
extern void eg_want_upkeep(void);

/* Current time as the worker sees it: real time plus eventgrid.clock_offset. */
extern TimestampTz eg_now(void);
extern TimestampTz eg_transaction_now(void);

#endif							/* EVENTGRID_H */
