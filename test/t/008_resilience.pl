# The worker under crashes, errors, locks and hostile defaults (issue
# "Trust", items 6, 8, 9, 10 and 11):
#  6. after kill -9 only requests that were handed to HTTP are charged an
#     attempt; queued ones are not (max_concurrent_requests = 1);
#  8. lock contention and pg_cancel_backend() make the worker retry inside
#     its loop: it does not exit and sends nothing twice;
#  9. a database default of default_transaction_read_only = on does not stop it;
# 10. drop_topic() concurrent with the worker's recording does not deadlock;
# 11. due rows locked by another session do not make it spin.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = new_node('resilience', 'eventgrid.response_timeout' => "'30s'", 'eventgrid.max_concurrent_requests' => 1,
	restart_after_crash => 'on', deadlock_timeout => "'200ms'");
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }
sub worker_pid { return sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'") }
sub ids_at
{
	my %n;
	$n{ $json->decode($_->{body})->[0]{id} }++ for requests($r, shift);
	return \%n;
}
sub publish_n
{
	my ($topic, $prefix, $n) = @_;
	sql("INSERT INTO eventgrid.events (topic, event) SELECT '$topic', jsonb_build_object('id', '$prefix-' || i, "
		  . "'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z') FROM generate_series(1, $n) i");
}

# --- 6. a crash charges only what was sent
sql("SELECT eventgrid.create_topic('crash')");
sql("SELECT eventgrid.create_event_subscription('crash', 'slow', '$u/status/200/slow?delay_ms=300', max_delivery_attempts => 2, deadletter => true)");
publish_n('crash', 'c', 30);
for my $round (1 .. 2)
{
	wait_for_requests($r, '/status/200/slow', 3 * $round, 30);
	my $pid = worker_pid();
	kill 'KILL', $pid;
	ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker' AND pid <> $pid", '1', 60),
		"crash $round: a new worker runs");
}
ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics WHERE topic = 'crash'", '0', 90), 'crash: the queue drains');
my $seen = ids_at('/status/200/slow');
is(scalar(keys %$seen), 30, 'crash: every event reached the receiver');
is(sql("SELECT delivered + dead_lettered || '/' || dropped FROM eventgrid.delivery_statistics WHERE subscription = 'slow'"),
	'30/0', 'crash: every event delivered or dead-lettered, none lost');
# an attempt is charged only for a request the receiver got: a dead letter's
# attempts were all sent, and a request never counts more earlier attempts
# than the receiver had seen
my @dead = split /\n/, sql("SELECT event->>'id' || ' ' || delivery_attempts FROM eventgrid.dead_letters");
ok(!(grep { my ($id, $n) = split / /; ($seen->{$id} // 0) < $n } @dead),
	'crash: no event dead-lettered with attempts it was not sent (' . scalar(@dead) . ' dead-lettered after two sends)');
my %before;
my $overcount = 0;
for my $req (requests($r, '/status/200/slow'))
{
	my $id = $json->decode($req->{body})->[0]{id};
	$overcount++ if ($req->{headers}{'aeg-delivery-count'} // 0) > ($before{$id} // 0);
	$before{$id}++;
}
is($overcount, 0, 'crash: aeg-delivery-count never counts an attempt the receiver did not get');
# first attempts are recorded a chunk at a time: a crash charges every
# request of the unrecorded chunk that went out, and no more than that.
# The upkeep worker and the restarted delivery worker both take back what
# was left, in turns: one charges what went out, and the other may then
# release leased retries that never went out (a line charging 0).
my @charged = grep { $_ > 0 } slurp_file($node->logfile) =~ /(\d+) of them had been sent and are counted as attempts/g;
my $sent = scalar(requests($r, '/status/200/slow'));
my $charged_sum = 0;
$charged_sum += $_ for @charged;
ok(@charged == 2 && !(grep { $_ < 1 } @charged) && $charged_sum <= $sent,
	'crash: per restart, the requests of the chunk in flight that went out are charged (' . join(', ', @charged) . ')');

sql("ALTER SYSTEM SET eventgrid.max_concurrent_requests = 64; SELECT pg_reload_conf()");

# --- 8. lock contention and cancellation: no exit, no duplicate
sql("ALTER DATABASE postgres SET lock_timeout = '100ms'");
ok(restart_workers($node), 'the workers restarted with the database lock_timeout');
my $pid = worker_pid();
sql("SELECT eventgrid.create_topic('locks')");
sql("SELECT eventgrid.create_event_subscription('locks', 'counted', '$u/status/200/counted')");
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN; LOCK TABLE eventgrid.subscription_counters IN SHARE MODE;');
publish_n('locks', 'l', 20);
wait_for_requests($r, '/status/200/counted', 20, 30);
sleep 1;
for (1 .. 2)
{
	sql("SELECT pg_cancel_backend($pid)");
	usleep(400_000);
}
$holder->query_safe('COMMIT');
$holder->quit;
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'counted'", '20', 30),
	'locks: all outcomes recorded once the lock is released');
is(worker_pid(), $pid, 'locks: the worker did not exit (lock wait, two cancellations)');
my $counted = ids_at('/status/200/counted');
is(scalar(grep { $counted->{$_} == 1 } keys %$counted), 20, 'locks: every event was POSTed exactly once');
like(slurp_file($node->logfile), qr/canceling statement due to user request/, 'locks: the cancellation was logged');
unlike(slurp_file($node->logfile), qr/canceling statement due to lock timeout/,
	'locks: the database lock_timeout does not apply to the worker');
sql("ALTER DATABASE postgres RESET lock_timeout");

# --- 9. default_transaction_read_only = on for the database
sql("ALTER DATABASE postgres SET default_transaction_read_only = on");
ok(restart_workers($node), 'the workers restarted with a read-only default');
$node->safe_psql('postgres', "SET default_transaction_read_only = off; SELECT eventgrid.create_topic('ro-topic'); "
	  . "SELECT eventgrid.create_event_subscription('ro-topic', 'ro-sub', '$u/status/200/ro'); "
	  . "SELECT eventgrid.publish('ro-topic', '" . eg_event('ro-1') . "')");
is(scalar(wait_for_requests($r, '/status/200/ro', 1, 30)), 1, 'read-only default: the event is delivered');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'ro-sub'", '1', 30),
	'read-only default: the outcome is recorded');
$node->safe_psql('postgres', "SET default_transaction_read_only = off; ALTER DATABASE postgres RESET default_transaction_read_only");

# --- 10. one lock order: drop_topic while the worker records.  X holds the
# subscription's counter row, so the worker's recording stops halfway, after
# it has locked the subscription; drop_topic then runs.  Taking subscriptions
# before retries, as drop_topic does, the worker makes drop_topic wait
# instead of deadlocking with it.
sql("SELECT eventgrid.create_topic('order')");
my $sid = sql("SELECT eventgrid.create_event_subscription('order', 'slowish', '$u/status/200/order?delay_ms=1000')");
publish_n('order', 'o', 5);
wait_for_requests($r, '/status/200/order', 5, 30);
my $x = $node->background_psql('postgres');
$x->query_safe("BEGIN; SELECT * FROM eventgrid.subscription_counters WHERE subscription_id = $sid FOR UPDATE;");
sleep 2;    # the answers are back: the worker is recording, and waits for X
my $y = $node->background_psql('postgres', on_error_stop => 0);
$y->query_until(qr/dropping/, "\\echo dropping\nSELECT eventgrid.drop_topic('order');\n\\echo dropped\n");
sleep 1;
$x->query_safe('COMMIT');
$x->quit;
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.topics WHERE name = 'order'", '0', 30), 'lock order: drop_topic finished');
$y->quit;
unlike(slurp_file($node->logfile), qr/deadlock detected/, 'lock order: no deadlock between drop_topic and the worker');

# --- 11. due rows locked elsewhere: the worker backs off instead of spinning
sql("SELECT eventgrid.create_topic('spin')");
sql("SELECT eventgrid.create_event_subscription('spin', 'spin-sub', '$u/status/200/spin')");
sql("ALTER SYSTEM SET eventgrid.delivery_paused = on; SELECT pg_reload_conf()");
sleep 1;
publish_n('spin', 's', 3);
my $locker = $node->background_psql('postgres');
$locker->query_safe("BEGIN; SELECT subscription_id FROM eventgrid.subscription_positions FOR UPDATE;");
sql("ALTER SYSTEM SET eventgrid.delivery_paused = off; SELECT pg_reload_conf()");
sleep 1;
my $commits = "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'";
my $c0 = sql("SELECT pg_stat_clear_snapshot(); $commits");
sleep 3;
my $c1 = sql("SELECT pg_stat_clear_snapshot(); $commits");
note("commits in 3 s while due rows are locked elsewhere: " . ($c1 - $c0));
cmp_ok($c1 - $c0, '<', 500, 'locked due rows: the worker does not spin (tens of commits, not tens of thousands)');
$locker->query_safe('COMMIT');
$locker->quit;
is(scalar(wait_for_requests($r, '/status/200/spin', 3, 30)), 3, 'locked due rows: delivered once the lock goes');

$node->stop;
done_testing();
