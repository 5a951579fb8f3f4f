# Pausing without a superuser (issue "Operate without a superuser", item 2):
# eventgrid.pause_delivery() / resume_delivery() as the admin role, for one
# event subscription, a topic, or everything; paused deliveries wait at
# their position (first attempts) or stay due (retries), nothing is lost,
# other subscriptions go on; delivery_statistics.paused shows it; each
# change is logged once.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = new_node('pause');
my $r = start_receiver();
my $u = $r->{url};

sub sql { return $node->safe_psql('postgres', shift) }
sub ops { return $node->safe_psql('postgres', "SET ROLE ops; " . shift) }

sub fails { return sql_error($node, @_) }

sub publish
{
	my ($topic, $prefix, $n) = @_;
	sql("SELECT eventgrid.publish('$topic', '[" . join(',', map { eg_event("$prefix-$_") } 1 .. $n) . "]')");
}

sql("CREATE ROLE ops LOGIN IN ROLE eventgrid_admin; CREATE ROLE app LOGIN IN ROLE eventgrid_publisher");
sql("SELECT eventgrid.create_topic('work'); SELECT eventgrid.create_topic('other')");
sql("SELECT eventgrid.create_event_subscription('work', 'sub-a', '$u/status/200/a')");
sql("SELECT eventgrid.create_event_subscription('work', 'sub-b', '$u/status/200/b')");
sql("SELECT eventgrid.create_event_subscription('other', 'sub-c', '$u/status/200/c')");

# --- one subscription
ops("SELECT eventgrid.pause_delivery('work', 'sub-a')");
ops("SELECT eventgrid.pause_delivery('work', 'sub-a')");
is(sql("SELECT string_agg(subscription || ' ' || paused, ', ' ORDER BY subscription) FROM eventgrid.delivery_statistics"),
	'sub-a true, sub-b false, sub-c false', 'the admin role paused subscription a: delivery_statistics.paused');
ok(wait_for_sql($node, "SET ROLE ops; SELECT activity FROM eventgrid.worker_status WHERE worker = 'delivery worker 1'",
	'eventgrid: idle; 1 event subscription paused by pause_delivery()'), 'the worker\'s status line says so');
publish('work', 'w', 5);
publish('other', 'o', 5);
is(scalar(wait_for_requests($r, '/status/200/b', 5)), 5, 'b, on the same topic, goes on');
is(scalar(wait_for_requests($r, '/status/200/c', 5)), 5, 'and c, on another topic');
sleep 2;
is(scalar(requests($r, '/status/200/a')), 0, 'nothing is sent to the paused subscription');
is(sql("SELECT pending FROM eventgrid.delivery_statistics WHERE subscription = 'sub-a'"), '5', 'its 5 events wait');
ops("SELECT eventgrid.resume_delivery('work', 'sub-a')");
is(scalar(wait_for_requests($r, '/status/200/a', 5)), 5, 'resumed: all 5 arrive');

# --- a retry of a paused subscription stays due, and goes once resumed
sql("SELECT eventgrid.create_event_subscription('work', 'sub-r', '$u/seq/500,200/r')");
publish('work', 'r', 1);
ok(wait_recorded($node, 'sub-r', 1), 'r failed once and waits for a retry');
ops("SELECT eventgrid.pause_delivery('work', 'sub-r')");
advance_clock($node, 20);
sleep 2;
is(sql("SELECT attempts FROM eventgrid.retries x JOIN eventgrid.event_subscriptions s ON s.id = x.subscription_id"
		  . " WHERE s.name = 'sub-r'"), '1', 'paused, its due retry is not attempted');
ops("SELECT eventgrid.resume_delivery('work', 'sub-r')");
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'sub-r'", '1', 30),
	'resumed, the retry is delivered');

# --- a topic, then everything
ops("SELECT eventgrid.pause_delivery('other')");
publish('other', 'o2', 3);
publish('work', 'w2', 2);
is(scalar(wait_for_requests($r, '/status/200/b', 8)), 8, 'the other topic goes on while one is paused (sub-b: 5, 1 and 2)');
sleep 1;
is(scalar(requests($r, '/status/200/c')), 5, 'nothing new reaches the paused topic\'s subscription');
ops("SELECT eventgrid.pause_delivery()");
ok(wait_for_sql($node, "SET ROLE ops; SELECT activity FROM eventgrid.worker_status WHERE worker = 'delivery worker 1'",
	'eventgrid: idle; every event subscription paused by pause_delivery()'), 'everything paused: the status line says so');
publish('work', 'w3', 2);
sleep 2;
is(scalar(requests($r, '/status/200/b')), 8, 'everything paused: nothing is sent');
is(sql("SELECT bool_and(paused) FROM eventgrid.delivery_statistics"), 't', 'every subscription shows paused');
ops("SELECT eventgrid.resume_delivery()");
is(scalar(wait_for_requests($r, '/status/200/c', 8)), 8, 'resume_delivery() resumes every pause: the topic\'s 3 arrive');
is(scalar(wait_for_requests($r, '/status/200/b', 10)), 10, 'and the 2 published while everything was paused');
ok(wait_for_sql($node, "SELECT sum(pending) FROM eventgrid.delivery_statistics", '0', 30), 'nothing left, nothing lost');
is(sql("SELECT count(*) FROM eventgrid.dead_letter_events") . '/' . sql("SELECT sum(dropped) FROM eventgrid.delivery_statistics"),
	'0/0', 'no event dead-lettered or dropped');

# --- refusals, and the log
like(fails("SELECT eventgrid.pause_delivery(NULL, 'sub-a')", 'ops'), qr/22004: a subscription is named with its topic/,
	'a subscription without its topic: 22004');
like(fails("SELECT eventgrid.pause_delivery('nope')", 'ops'), qr/42704: topic "nope" does not exist/, 'no such topic: 42704');
like(fails("SELECT eventgrid.pause_delivery('work', 'nope')", 'ops'), qr/42704/, 'no such subscription: 42704');
like(fails("SELECT eventgrid.pause_delivery()", 'app'), qr/42501: permission denied for function pause_delivery/,
	'a publisher may not pause (42501)');
my $log = slurp_file($node->logfile);
my @paused_a = $log =~ /LOG:  eventgrid: delivery paused for event subscription "sub-a" of topic "work" by ops/g;
is(scalar(@paused_a), 1, 'pausing is logged once, though asked twice');
like($log, qr/LOG:  eventgrid: delivery resumed for all event subscriptions by ops/, 'and resuming');

$node->stop;
done_testing();
