/*
 * pause.c - pause points: named places in the workers where a test can
 * hold a worker, to make an interleaving of sessions happen every time
 * rather than by luck (as PostgreSQL's injection points, which Debian's
 * builds leave out).  Off unless the developer option
 * eventgrid.debug_pause_points lists the point; then, each time a worker
 * passes it, it logs "eventgrid: at pause point "NAME"" and waits while
 * another session holds the advisory lock
 * pg_advisory_lock(EG_PAUSE_LOCK_CLASS, hashtext('NAME')) in the worker's
 * database (logging "eventgrid: waiting at pause point "NAME"" first).
 */
#include "core/eventgrid.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/lock.h"

/* Is name one of the comma-separated names of eventgrid.debug_pause_points? */
static bool
listed(const char *name)
{
	size_t		len = strlen(name);
	const char *p = eg_debug_pause_points;

	while (p && *p)
	{
		const char *end = strchr(p, ',');
		size_t		n;

		while (*p == ' ')
			p++;
		n = end ? (size_t) (end - p) : strlen(p);
		while (n > 0 && p[n - 1] == ' ')
			n--;
		if (n == len && strncmp(p, name, len) == 0)
			return true;
		p = end ? end + 1 : NULL;
	}
	return false;
}

/*
 * Passes the pause point name: returns at once unless
 * eventgrid.debug_pause_points lists it; else logs the pass and waits
 * (10 ms polls, interruptible) until the point's advisory lock is free.
 * Takes no lock that outlives the call; may be called in or out of a
 * transaction.
 */
void
eg_pause_point(const char *name)
{
	LOCKTAG		tag;
	bool		logged = false;

	if (eg_debug_pause_points == NULL || eg_debug_pause_points[0] == '\0' || !listed(name))
		return;
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, EG_PAUSE_LOCK_CLASS,
						 DatumGetUInt32(hash_any((const unsigned char *) name, strlen(name))), 2);
	ereport(LOG, (errmsg("eventgrid: at pause point \"%s\"", name)));
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (LockAcquire(&tag, ShareLock, true, true) != LOCKACQUIRE_NOT_AVAIL)
		{
			LockRelease(&tag, ShareLock, true);
			break;
		}
		if (!logged)
			ereport(LOG, (errmsg("eventgrid: waiting at pause point \"%s\"", name)));
		logged = true;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	/* a wakeup meant for the worker's own wait may have been taken here */
	if (logged)
		SetLatch(MyLatch);
}
