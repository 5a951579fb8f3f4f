/*
 * worker.h - what the delivery workers and the upkeep worker share
 * (worker.c): start-up (signals, connection, pinned settings, the pid slot
 * in the database's shared slot), leaving when idle or asked to, the top of
 * each loop round, units of database work that back off after an ERROR,
 * and recovery from that ERROR.
 */
#ifndef EVENTGRID_WORKER_H
#define EVENTGRID_WORKER_H

#include "core/eventgrid.h"

extern const char *eg_worker_kind;	/* "delivery worker 2", "upkeep worker" */
extern MemoryContext eg_round_cxt;	/* scratch memory of one loop round */
extern int	eg_error_streak;	/* units of work failed in a row */
extern TimestampTz eg_db_retry_at;	/* no database work before this */
extern uint64 eg_units_committed;	/* units of work committed so far */

/* the settings every eventgrid worker's statements depend on (search_path, synchronous_commit, ...): see worker.c */
extern void eg_pin_settings(void);
extern void eg_worker_start(Datum dboid, const char *kind, int number);
extern void eg_worker_saw_wakes(void);
extern void eg_worker_busy(void);
extern bool eg_worker_should_leave(TimestampTz idle_since);
pg_noreturn extern void eg_worker_leave(TimestampTz next_at);
extern bool eg_begin_round(void);
extern bool eg_begin_work(const char *activity);
extern void eg_end_work(void);
extern void eg_recover_from_error(void (*drop_partial) (void));

#endif							/* EVENTGRID_WORKER_H */
