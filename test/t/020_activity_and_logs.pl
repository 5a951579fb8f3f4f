# What the delivery worker shows and logs: pg_stat_activity says whether it
# is idle, delivering (requests in flight, waiting, the backlog) or paused;
# pausing and resuming are logged once each; dead-lettered and dropped
# events are summed up in one LOG line a minute, never a line per event.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = new_node('activity', 'eventgrid.max_concurrent_requests' => 2);
my $r = start_receiver();
my $u = $r->{url};

sub sql { return $node->safe_psql('postgres', shift) }
sub count_log { my $re = shift; my @m = slurp_file($node->logfile) =~ /$re/g; return scalar @m }

# polls until the delivery worker's state and activity text match $re
sub wait_activity
{
	my ($re, $secs) = @_;
	my $got = '';
	for (1 .. ($secs // 30) * 10)
	{
		$got = sql("SELECT state || ' | ' || query FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'");
		return $got if $got =~ $re;
		usleep(100_000);
	}
	diag("activity was [$got]");
	return undef;
}

sub publish_n
{
	my ($topic, $tag, $n) = @_;
	sql("INSERT INTO eventgrid.events (topic, event) SELECT '$topic', jsonb_build_object('id', '$tag-' || i,"
		  . " 'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z') FROM generate_series(1, $n) i");
}

start_workers($node);
ok(wait_activity(qr/^idle \| eventgrid: idle$/), 'idle: shown as idle');

# --- delivering: two connections, a slow endpoint, and a backlog behind them
sql("SELECT eventgrid.create_topic('busy')");
sql("SELECT eventgrid.create_event_subscription('busy', 'slow', '$u/slow?delay_ms=1000')");
publish_n('busy', 'a', 20);
wait_for_requests($r, '/slow', 1, 30);
publish_n('busy', 'b', 20);
my $shown = wait_activity(qr/^active \| eventgrid: delivering: 2 requests in flight, \d+ waiting to be sent, \d+ outcomes to record, \d+ kB held; backlog of about 20 deliveries$/);
ok($shown, 'delivering: requests in flight and waiting, and the backlog not yet claimed');
note($shown // '');
ok(wait_activity(qr/^idle \| eventgrid: idle/, 60), 'idle again once the backlog is delivered');
is(scalar(requests($r, '/slow')), 40, 'all delivered');

# --- paused and resumed: logged once each
sql("ALTER SYSTEM SET eventgrid.delivery_paused = on; SELECT pg_reload_conf()");
ok(wait_activity(qr/^idle \| eventgrid: paused \(eventgrid\.delivery_paused\); 0 requests in flight$/), 'paused: shown');
sql("SELECT pg_reload_conf()");    # another reload changes nothing
sleep 1;
sql("ALTER SYSTEM SET eventgrid.delivery_paused = off; SELECT pg_reload_conf()");
ok(wait_activity(qr/^idle \| eventgrid: idle/), 'resumed: idle again');
is(count_log(qr/eventgrid: delivery paused \(eventgrid\.delivery_paused = on\)/), 1, 'paused: logged once');
is(count_log(qr/eventgrid: delivery resumed/), 1, 'resumed: logged once');

# --- dead-lettered and dropped events: one summary line, by reason
sql("SELECT eventgrid.create_topic('fails')");
sql("SELECT eventgrid.create_event_subscription('fails', 'refused', '$u/status/400/refused', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('fails', 'dropping', '$u/status/400/dropping')");
publish_n('fails', 'f', 3);
ok(wait_for_sql($node, "SELECT sum(dead_lettered) || '/' || sum(dropped) FROM eventgrid.delivery_statistics WHERE topic = 'fails'",
	'3/3'), 'three dead-lettered, three dropped');
my $summary = qr/eventgrid: since the last summary 3 events were dead-lettered and 3 dropped/;
my $logged = 0;
for (1 .. 750)
{
	$logged = count_log($summary);
	last if $logged;
	usleep(100_000);
}
is($logged, 1, 'summary: one line within a minute');
like(slurp_file($node->logfile), qr/DETAIL:  Dead-lettered by reason: NonRetriableError 3\./, 'summary: by reason');
is(count_log(qr/f-[123]/), 0, 'summary: no line names an event');

# the admin role, not a superuser, reads the workers' status lines through
# eventgrid.worker_status; pg_stat_activity hides them from it
$node->safe_psql('postgres', 'CREATE ROLE watcher LOGIN IN ROLE eventgrid_admin');
is($node->safe_psql('postgres', "SET ROLE watcher; SELECT count(*) FROM pg_stat_activity"
		  . " WHERE backend_type = 'eventgrid delivery worker' AND query LIKE 'eventgrid:%'"), '0',
	'pg_stat_activity shows the admin role no status line of the workers');
like($node->safe_psql('postgres', "SET ROLE watcher; SELECT string_agg(worker || ' ' || (pid IS NOT NULL) || ' '"
		  . " || coalesce(activity, '-'), ' | ' ORDER BY worker) FROM eventgrid.worker_status"),
	qr/^delivery worker 1 true eventgrid: (idle|delivering)[^|]* \| upkeep worker true /,
	'eventgrid.worker_status does: each worker, its pid and its status line');
ok(wait_for_sql($node, "SELECT state || ' ' || activity FROM eventgrid.worker_status WHERE worker = 'upkeep worker'",
	'idle eventgrid: idle', 10), 'the upkeep worker between upkeeps says it is idle, not the name of its last step');
like(($node->psql('postgres', "SET ROLE watcher; SELECT * FROM eventgrid._worker_pids()"))[2] // '',
	qr/permission denied for function _worker_pids/, 'while _worker_pids() stays the superuser\'s');

$node->stop;
done_testing();
