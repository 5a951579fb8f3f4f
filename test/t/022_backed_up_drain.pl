# A backed-up endpoint host that drains is claimed from again at once, also
# when its last requests finish in the same round of the worker's loop.
#
# With eventgrid.max_requests_per_endpoint at least
# eventgrid.max_concurrent_requests, one set of requests can take a
# backed-up host's whole queue, and a fast receiver answers them all before
# the worker looks again.  The worker then has nothing queued and nothing in
# flight while the subscription's next events wait in the database: it must
# claim them, not sleep until something else wakes it (an idle worker sleeps
# up to a minute).  A claim takes at most 1,000 events per subscription, so
# 3,000 events in one transaction cross that point twice.
#
# The bound below (60 s for what takes a few seconds) only tells a stalled
# drain from a working one; it measures nothing.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $events = 3000;
my $node = new_node('backed_up',
	'eventgrid.max_concurrent_requests' => 1,
	'eventgrid.max_requests_per_endpoint' => 1);
my $r = start_receiver();

sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('drain')");
sql("SELECT eventgrid.create_event_subscription('drain', 'one', '$r->{url}/status/200/one')");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'drain', jsonb_build_object("
	  . "'id', 'e-' || i, 'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z')"
	  . " FROM generate_series(1, $events) i");

my $t0 = time;
ok(wait_for_sql($node,
		"SELECT delivered || ' ' || pending FROM eventgrid.delivery_statistics WHERE subscription = 'one'",
		"$events 0", 60),
	"all $events events delivered while the worker drains one backed-up host, nothing pending");
my $secs = time - $t0;
my %ids = map { $_->{body} =~ /"id": ?"(e-\d+)"/ ? ($1 => 1) : () } requests($r, '/status/200/one');
is(scalar(keys %ids), $events, 'the receiver got every event');
diag(sprintf("backed-up drain: %d events over one connection in %.1f s", $events, $secs));

$node->stop('immediate');
done_testing();
