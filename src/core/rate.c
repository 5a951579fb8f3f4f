/*
 * rate.c - per-subscription rate limits (an event subscription's
 * max_events_per_second, 1-100,000).
 *
 * Each rate-limited event subscription has a token bucket in shared memory
 * (EgShared.rate, under its spinlock), shared by every delivery worker: it
 * refills at the rate, holds at most one second's worth, and every event
 * sent (a batch counts its events; first attempts and retries alike) takes
 * a token when it is claimed.  A claim takes no more events than tokens:
 * the others stay where they are, first attempts at the subscription's
 * position and retries in eventgrid.retries (due again when the next token
 * comes), never in a worker's memory, and other subscriptions are not
 * held up.  A subscription's bucket (keyed by its database and its id) is
 * one of 16 slots they hash to; a
 * bucket not used for a second is full, so when all 16 are in use the one
 * idle longest is taken for a new subscription.
 * Buckets start full and do not survive a server restart.
 */
#include "core/rate.h"

#include "miscadmin.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

#define EG_RATE_PROBE 16

TimestampTz eg_rate_next_at = DT_NOEND;

/*
 * The slots sid may have: EG_RATE_PROBE of them from its hash, so that a
 * lookup under the spinlock stays short.
 */
static inline EgRateBucket *
slot(int64 sid, int k)
{
	return &eg_shared->rate[(((uint64) sid ^ ((uint64) MyDatabaseId << 40)) * UINT64CONST(0x9E3779B97F4A7C15) + k)
							% EG_RATE_BUCKETS];
}

/* The bucket of sid, or NULL; caller holds the mutex. */
static EgRateBucket *
find_bucket(int64 sid)
{
	for (int k = 0; k < EG_RATE_PROBE; k++)
	{
		EgRateBucket *b = slot(sid, k);

		if (b->subscription_id == sid && b->dboid == MyDatabaseId)
			return b;
	}
	return NULL;
}

/* The bucket of sid, made (full) when it has none; caller holds the mutex. */
static EgRateBucket *
bucket_of(int64 sid, int rate, TimestampTz now)
{
	EgRateBucket *oldest = find_bucket(sid);

	if (oldest != NULL)
		return oldest;
	oldest = slot(sid, 0);
	for (int k = 1; k < EG_RATE_PROBE; k++)
	{
		EgRateBucket *b = slot(sid, k);

		if (b->at < oldest->at)
			oldest = b;			/* a free slot has at 0: the oldest of all */
	}
	oldest->dboid = MyDatabaseId;
	oldest->subscription_id = sid;
	oldest->tokens = rate;
	oldest->at = now;
	return oldest;
}

int
eg_rate_take(int64 sid, int rate, int want, TimestampTz now)
{
	EgRateBucket *b;
	int			got;
	double		missing = 0;

	if (want <= 0)
		return 0;
	SpinLockAcquire(&eg_shared->mutex);
	b = bucket_of(sid, rate, now);
	if (now > b->at)
	{
		b->tokens = Min((double) rate, b->tokens + (double) (now - b->at) * rate / USECS_PER_SEC);
		b->at = now;
	}
	got = b->tokens >= want ? want : b->tokens >= 1 ? (int) b->tokens : 0;
	b->tokens -= got;
	if (got < want)
		missing = 1 - b->tokens;
	SpinLockRelease(&eg_shared->mutex);
	if (got < want)
	{
		TimestampTz next = now + (TimestampTz) (missing * USECS_PER_SEC / rate) + 1;

		eg_rate_next_at = Min(eg_rate_next_at, next);
	}
	return got;
}

void
eg_rate_give_back(int64 sid, int rate, int n)
{
	EgRateBucket *b;

	if (n <= 0)
		return;
	SpinLockAcquire(&eg_shared->mutex);
	b = find_bucket(sid);		/* gone only if evicted meanwhile: nothing to give back to */
	if (b != NULL)
		b->tokens = Min((double) rate, b->tokens + n);
	SpinLockRelease(&eg_shared->mutex);
}

void
eg_rate_reset_next(void)
{
	eg_rate_next_at = DT_NOEND;
}
