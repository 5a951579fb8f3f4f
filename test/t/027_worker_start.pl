# A delivery worker whose start fails leaves no stale pid and no dangling
# latch behind, and the launcher tells running workers from stopped ones by
# their shared slots, never by kill(pid, 0), which a reused pid would fool.
#
# Before, the worker published its latch and pid before registering the
# exit callback that clears them; its HTTP thread's start could fail in
# between, leaving the dead process's pid in its slot.  Here the HTTP
# thread cannot start (a library preloaded into the cluster makes
# pthread_create fail while a file exists): the delivery worker exits at
# each start and its slot reads empty between the launcher's tries, while
# the upkeep worker, started by the launcher on its own, runs on.  Once
# threads can start again, the worker starts and delivers.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $dir = PostgreSQL::Test::Utils::tempdir;
my $flag = "$dir/no-threads";
open(my $fh, '>', "$dir/no_threads.c") or die;
print $fh <<'C';
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

/* pthread_create fails with EAGAIN while the file named by EG_TEST_NO_THREADS exists */
int
pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start) (void *), void *arg)
{
	static int	(*real) (pthread_t *, const pthread_attr_t *, void *(*) (void *), void *) = NULL;
	const char *flag = getenv("EG_TEST_NO_THREADS");

	if (flag != NULL && access(flag, F_OK) == 0)
		return EAGAIN;
	if (real == NULL)
		real = (int (*) (pthread_t *, const pthread_attr_t *, void *(*) (void *), void *))
			dlsym(RTLD_NEXT, "pthread_create");
	return real(thread, attr, start, arg);
}
C
close($fh);
system('cc', '-shared', '-fPIC', '-o', "$dir/no_threads.so", "$dir/no_threads.c", '-ldl') == 0
  or BAIL_OUT('could not build the thread library');
open($fh, '>', $flag) or die;
close($fh);

my $r = start_receiver();
my $u = $r->{url};
my $node = PostgreSQL::Test::Cluster->new('worker_start');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'eventgrid'\n");
{
	local $ENV{LD_PRELOAD} = "$dir/no_threads.so";
	local $ENV{EG_TEST_NO_THREADS} = $flag;
	$node->start;
}
sub sql { return $node->safe_psql('postgres', shift) }
sql('CREATE EXTENSION eventgrid');
sql("SELECT eventgrid.create_topic('start')");
sql("SELECT eventgrid.create_event_subscription('start', 'sub', '$u/status/200/start')");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('start', '" . eg_event('s-1') . "')");

my $failures = 0;
for (1 .. 300)
{
	$failures = () = slurp_file($node->logfile) =~ /could not start the HTTP thread/g;
	last if $failures > 1;
	usleep(100_000);
}
cmp_ok($failures, '>', 1, "the delivery worker failed to start, and again ($failures times)");

# A pid in the slot must be a running process: a worker whose start failed
# lives milliseconds, so a pid still there 300 ms later and gone from
# pg_stat_activity would be one left behind.
my ($stale, $empty) = (0, 0);
for (1 .. 40)
{
	my $pid = sql(q{SELECT pid FROM eventgrid._worker_pids() WHERE worker = 'delivery worker 1'});
	if ($pid eq '')
	{
		$empty++;
		usleep(50_000);
		next;
	}
	usleep(300_000);
	$stale++ if sql("SELECT (SELECT pid FROM eventgrid._worker_pids() WHERE worker = 'delivery worker 1') = $pid"
		  . " AND NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $pid)") eq 't';
}
is($stale, 0, 'no look found the pid of a delivery worker that had exited');
cmp_ok($empty, '>', 0, "between tries the slot is empty ($empty of 40 looks)");
like(sql(q{SELECT pid IS NOT NULL FROM eventgrid._worker_pids() WHERE worker = 'upkeep worker'}), qr/^t$/,
	'the upkeep worker runs on its own meanwhile');
is(scalar(requests($r)), 0, 'nothing was sent');

unlink($flag) or die;
ok(wait_for_requests($r, '/status/200/start', 1, 60), 'once threads can start, the worker starts and delivers');
ok(wait_for_sql($node, q{SELECT pid = (SELECT a.pid FROM pg_stat_activity a WHERE a.backend_type = 'eventgrid delivery worker')
                          FROM eventgrid._worker_pids() WHERE worker = 'delivery worker 1'}, 't', 30),
	'its slot names the running delivery worker');

$node->stop('immediate');
done_testing();
