# Taking back leases at scale (issue "Trust, third pass", item 9: found by
# the soak): 60,000 retries leased by a delivery worker that no longer runs,
# 15,000 of them named by its in-flight records (sent to HTTP), with the
# retries table's statistics taken while the leases were held (as an
# autovacuum ANALYZE before the crash takes them: every leased retry has the
# one owner, so the planner expects no stale lease at all).  The next delivery worker's recovery must
# read the retries a bounded number of times: the single statement of 0.11.0
# was planned as a nested loop reading the whole table again per leased
# retry, and held the database's deliveries for many minutes.  Every lease
# is released within 60 s, the 15,000 sent ones charged an attempt (Aborted),
# the others not.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('recovery_scale', 'eventgrid.delivery_workers' => 1);
sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('orders')");
# nothing listens on port 9 (delivery stays paused: nothing is attempted)
sql("SELECT eventgrid.create_event_subscription('orders', 'sink', 'http://127.0.0.1:9/x')");
sql("SELECT eventgrid.pause_delivery()");
sql("ALTER TABLE eventgrid.retries SET (autovacuum_enabled = false);"
	  . " ALTER TABLE eventgrid.requests_in_flight SET (autovacuum_enabled = false)");
my $gone = 999999;    # no process has this pid
sql("BEGIN;"
	  . " INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes, attempts,"
	  . "        next_attempt_at, lease_owner)"
	  . " SELECT s.id, i, jsonb_build_object('id', i::text, 'subject', '/s', 'eventType', 'T', 'pad', repeat('x', 500)),"
	  . "        repeat('y', 500), now(), 600, 1, now() + interval '1 hour', $gone"
	  . "   FROM eventgrid.event_subscriptions s, generate_series(1, 60000) i;"
	  . " INSERT INTO eventgrid.requests_in_flight (lease_owner, wave, retry_ids)"
	  . " SELECT $gone, w, ARRAY(SELECT r.id FROM eventgrid.retries r WHERE r.id % 2000 = w AND r.id % 4 = 0)"
	  . "   FROM generate_series(0, 1999) w;"
	  . " COMMIT;"
	  . " ANALYZE eventgrid.retries; ANALYZE eventgrid.requests_in_flight");
is(sql("SELECT count(DISTINCT i) FROM eventgrid.requests_in_flight, unnest(retry_ids) i"), '15000',
	'15,000 of the 60,000 leased retries are named in flight');

# the next delivery worker to start takes back every stale lease; delivery
# stays paused meanwhile, so that no worker running before the restart
# claims (and, stopped by it, leaves leases of its own to take back: 61,000
# once under load)
my $log_at = -s $node->logfile;
ok(restart_workers($node), 'the delivery worker starts again');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries WHERE lease_owner = $gone", '0', 60),
	'every lease of the worker that no longer runs is released within 60 s');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.requests_in_flight WHERE lease_owner = $gone", '0', 5),
	'and its in-flight records are gone');
# the upkeep worker may take the 15,000 named ones first, the starting worker the rest
my ($taken, $charged) = (0, 0);
my @counts = slurp_file($node->logfile, $log_at) =~ /LOG:  eventgrid: (\d+) deliveries left in flight .* will be retried.*\n.*DETAIL:  (\d+) of them had been sent/g;
while (my ($t, $c) = splice(@counts, 0, 2))
{
	$taken += $t;
	$charged += $c;
}
is("$taken/$charged", '60000/15000', 'the log counts 60,000 taken back, 15,000 of them charged');
is(sql("SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'sink' AND outcome = 'Aborted' AND attempt = 2"), '15000',
	'the attempt history has an Aborted second attempt for each of the 15,000 sent, none for the others');
sql("ALTER TABLE eventgrid.retries RESET (autovacuum_enabled); ALTER TABLE eventgrid.requests_in_flight RESET (autovacuum_enabled)");
$node->stop;
done_testing();
