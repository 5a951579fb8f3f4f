/*
 * rate.h - per-subscription rate limits (max_events_per_second): a token
 * bucket per event subscription in shared memory, which the delivery
 * workers' claims take from (rate.c).
 */
#ifndef EG_RATE_H
#define EG_RATE_H

#include "core/eventgrid.h"

/*
 * Takes up to want tokens (events) from subscription sid's bucket, which
 * refills at rate events a second and holds at most rate (one second's
 * worth); returns how many it took (0..want).
 */
extern int	eg_rate_take(int64 sid, int rate, int want, TimestampTz now);

/* Puts back n tokens a claim took and did not use. */
extern void eg_rate_give_back(int64 sid, int rate, int n);

/*
 * When a subscription a claim left waiting for its rate gets its next
 * token (eg_now()'s clock), or DT_NOEND: the earliest over the calls to
 * eg_rate_take since eg_rate_reset_next().
 */
extern TimestampTz eg_rate_next_at;
extern void eg_rate_reset_next(void);

#endif
