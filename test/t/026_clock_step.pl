# A step of the wall clock does not stall the delivery worker.
#
# The worker's main thread waits for the HTTP thread with a deadline a few
# milliseconds ahead.  Measured on CLOCK_REALTIME, a step of the clock
# backwards after the deadline was taken moved it far into the future: the
# worker then sat in that wait, neither claiming nor recording, until a
# request finished, which for a hanging endpoint is the response timeout.
# The deadline is now on CLOCK_MONOTONIC.
#
# The step is made, for the cluster's processes only, by a small library
# preloaded into them (LD_PRELOAD) whose clock_gettime() reads
# CLOCK_REALTIME an hour ahead of the kernel's: every deadline taken on it
# is an hour late, as after a step back of an hour.  PostgreSQL's own
# timestamps (gettimeofday) and libcurl's timers (CLOCK_MONOTONIC) do not
# go through it.  With one request hanging, a new event to a healthy
# endpoint must still arrive long before the hanging request times out
# (20 s); the bound tells a stalled worker from a working one, it measures
# nothing.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $dir = PostgreSQL::Test::Utils::tempdir;
open(my $fh, '>', "$dir/clock_ahead.c") or die;
print $fh <<'C';
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>

/* CLOCK_REALTIME an hour ahead: as if the wall clock stepped back an hour after each reading */
int
clock_gettime(clockid_t id, struct timespec *ts)
{
	static int	(*real) (clockid_t, struct timespec *) = NULL;
	int			rc;

	if (real == NULL)
		real = (int (*) (clockid_t, struct timespec *)) dlsym(RTLD_NEXT, "clock_gettime");
	rc = real(id, ts);
	if (rc == 0 && id == CLOCK_REALTIME)
		ts->tv_sec += 3600;
	return rc;
}
C
close($fh);
system('cc', '-shared', '-fPIC', '-o', "$dir/clock_ahead.so", "$dir/clock_ahead.c", '-ldl') == 0
  or BAIL_OUT('could not build the clock library');

my $r = start_receiver();
my $u = $r->{url};
my $node = PostgreSQL::Test::Cluster->new('clock_step');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'eventgrid'\neventgrid.response_timeout = '20s'\neventgrid.worker_idle_timeout = '1h'\n");
{
	local $ENV{LD_PRELOAD} = "$dir/clock_ahead.so";
	$node->start;
}
sub sql { return $node->safe_psql('postgres', shift) }
sql('CREATE EXTENSION eventgrid');
sql("SELECT eventgrid.create_topic('clock')");
sql("SELECT eventgrid.create_event_subscription('clock', 'hanging', '$u/hang/h', included_event_types => ARRAY['Hang'])");
sql("SELECT eventgrid.create_event_subscription('clock', 'healthy', '$u/status/200/ok', included_event_types => ARRAY['Ok'])");
ok(start_workers($node), 'the delivery worker runs with the clock library preloaded');

sql("INSERT INTO eventgrid.events (topic, event) VALUES ('clock', '" . eg_event('h-1', eventType => 'Hang') . "')");
ok(wait_for_requests($r, '/hang/h', 1, 20), 'a request hangs at its endpoint');
my $t0 = time;
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('clock', '" . eg_event('ok-1', eventType => 'Ok') . "')");
ok(wait_for_requests($r, '/status/200/ok', 1, 30), 'the healthy event arrives');
my $secs = time - $t0;
cmp_ok($secs, '<', 10, sprintf('it arrived in %.1f s, not after the hanging request timed out (20 s)', $secs));
ok(wait_for_sql($node,
		"SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'healthy'", '1', 30),
	'and its outcome is recorded');

$node->stop('immediate');
done_testing();
