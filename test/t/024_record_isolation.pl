# One event subscription or endpoint whose rows cannot be written does not
# stop the others' outcomes from being recorded.
#
# Poisoned by hand, as a superuser, with constraints on eventgrid's own
# tables: the health row of an endpoint whose URL holds "poison" cannot be
# written (as an endpoint too long for its index could not be before 0.7.0),
# nor can a retry of one event subscription.  Before, every record failed
# as a whole: the healthy subscription's events reached its receiver but
# were never recorded as delivered, and its pending count only grew.  Now
# the next records write each subscription and each endpoint on its own;
# the poisoned subscription claims nothing new meanwhile; once the poison
# is gone, everything held is recorded.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('record_isolation', 'eventgrid.probation_failures' => 1000);
my $r = start_receiver();
my $u = $r->{url};

sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('iso')");
my $healthy = sql("SELECT eventgrid.create_event_subscription('iso', 'healthy', '$u/status/200/healthy')");
my $stuck = sql("SELECT eventgrid.create_event_subscription('iso', 'stuck', '$u/status/500/poison',"
	  . " max_delivery_attempts => 30)");
sql("ALTER TABLE eventgrid.endpoint_states ADD CONSTRAINT poison_endpoint CHECK (endpoint NOT LIKE '%poison%')");
sql("ALTER TABLE eventgrid.retries ADD CONSTRAINT poison_retry CHECK (subscription_id <> $stuck)");

sub publish
{
	my ($from, $to) = @_;
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'iso', jsonb_build_object('id', 'e-' || i,"
		  . " 'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z')"
		  . " FROM generate_series($from, $to) i");
}

publish(1, 20);
ok(wait_for_requests($r, '/status/500/poison', 1, 30), 'the poisoned subscription was attempted');
ok(wait_for_sql($node,
		"SELECT delivered || ' ' || pending FROM eventgrid.delivery_statistics WHERE subscription = 'healthy'",
		'20 0', 30),
	'the healthy subscription\'s 20 deliveries are recorded though a record with the poisoned rows fails');
publish(21, 40);
ok(wait_for_sql($node,
		"SELECT delivered || ' ' || pending FROM eventgrid.delivery_statistics WHERE subscription = 'healthy'",
		'40 0', 30),
	'and so are those published after');
is(sql("SELECT count(*) FROM eventgrid.retries WHERE subscription_id = $stuck"), '0',
	'nothing of the poisoned subscription is written');

my $log = slurp_file($node->logfile);
like($log, qr/recording the outcomes of event subscription $stuck failed: new row for relation "retries" violates check constraint "poison_retry"/,
	'the failing subscription is named in the log');
# (whichever fails first: the outcomes' record, or the poisoned endpoint's
# health when it is saved before its chunk's outcomes are all decided)
like($log, qr/^\s*eventgrid's (first-attempt record|retry record|endpoint health save) statement$/m,
	'and so is the statement that failed');
like($log, qr/recording the health of an endpoint of host http:\/\/127\.0\.0\.1:\d+ failed/,
	'the failing endpoint health is logged by host');
my $lines = () = $log =~ /recording the outcomes of event subscription $stuck failed/g;
cmp_ok($lines, '<=', 2, "logged once, not at every record ($lines times)");

# the poisoned subscription claims nothing new while its outcomes cannot be recorded
my $attempted = scalar(requests($r, '/status/500/poison'));
cmp_ok($attempted, '<=', 20, "the poisoned subscription was not claimed again ($attempted requests)");

# poison removed: what was held is recorded, and records are whole again
sql('ALTER TABLE eventgrid.retries DROP CONSTRAINT poison_retry');
sql('ALTER TABLE eventgrid.endpoint_states DROP CONSTRAINT poison_endpoint');
publish(41, 41);
ok(wait_for_sql($node,
		"SELECT (SELECT count(*) FROM eventgrid.retries WHERE subscription_id = $stuck) >= 20"
		  . " AND (SELECT count(*) FROM eventgrid.endpoint_states WHERE endpoint LIKE '%poison%') = 1",
		't', 30),
	'once the poison is gone the held outcomes and the endpoint health are written');
ok(wait_for_sql($node,
		"SELECT delivered || ' ' || pending FROM eventgrid.delivery_statistics WHERE subscription = 'healthy'",
		'41 0', 30),
	'and delivery goes on');

$node->stop('immediate');
done_testing();
