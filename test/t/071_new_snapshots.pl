# Three reads that must take a new snapshot, not the one their unit of work
# began with (issue "Trust, fifth pass", item 10: each reverted to the old
# snapshot passed every test).  Each needs another session to commit in the
# few milliseconds between the unit's first snapshot and the read; the
# developer option eventgrid.debug_pause_points holds the worker there
# (src/core/pause.c) while this test commits, so the interleaving happens
# every time:
#  - the rotation's second look at what holds an event table, under its
#    lock: a transaction that began before and commits between the first
#    look and the lock has rows a paused subscription still owes; read
#    with the old snapshot, the table was emptied and the event lost; the
#    same with a queue subscription, whose event the delivery worker made
#    receivable meanwhile (a reference into the table): never received;
#  - the look for due endpoint validations: a subscription created while the
#    upkeep worker's unit of work began is validated in that same round;
#  - the clean cuts of an ordered subscription's batch: a transaction of the
#    batch that commits after the claim began and before its scan must be
#    counted, or the claim cuts where a key's earlier event is left behind
#    its later one.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP qw(decode_json);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('new_snapshots', 'eventgrid.event_table_rotation' => "'1s'");
my $r = start_receiver();
sub sql { return $node->safe_psql('postgres', shift) }

# the session that holds pause points: pg_advisory_lock(1162301520, hashtext(point))
my $holder = $node->background_psql('postgres');
sub hold { $holder->query_safe(join(', ', 'SELECT 1', map { "pg_advisory_lock(1162301520, hashtext('$_'))" } @_)) }
sub free { $holder->query_safe(join(', ', 'SELECT 1', map { "pg_advisory_unlock(1162301520, hashtext('$_'))" } @_)) }
sub pause_at
{
	my $points = join(', ', @_);
	sql("ALTER SYSTEM SET eventgrid.debug_pause_points = '$points'; SELECT pg_reload_conf()");
}
sub waiting_at
{
	my ($point, $offset) = @_;
	return $node->wait_for_log(qr/eventgrid: waiting at pause point "$point"/, $offset);
}

# --- the rotation's second look, under the table's lock
sql("SELECT eventgrid.create_topic('rot')");
sql("SELECT eventgrid.create_event_subscription('rot', 'sub', '$r->{url}/status/200/rot')");
ok(start_workers($node), 'the delivery and the upkeep worker run');
sql("SELECT eventgrid.pause_delivery('rot', 'sub')");
hold('truncate-lock');
# a publisher whose transaction began while its table was taking rows
my $late = $node->background_psql('postgres');
$late->query_safe("BEGIN; SELECT eventgrid.publish('rot', '" . eg_event('late') . "')");
my $offset = -s $node->logfile;
pause_at('truncate-lock');
# the table turns (1 s); the upkeep's first look sees no row of it (the
# publisher has not committed), and it waits before taking the lock
ok(waiting_at('truncate-lock', $offset), 'the upkeep worker looked at the table and waits before locking it');
$late->query_safe('COMMIT');
$late->quit;
free('truncate-lock');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '1', 30),
	'the second look saw the committed row the paused subscription owes: it was moved into its retries, not emptied away');
sql("ALTER SYSTEM RESET eventgrid.debug_pause_points; SELECT pg_reload_conf()");
sql("SELECT eventgrid.resume_delivery('rot', 'sub')");
ok(wait_for_requests($r, '/status/200/rot', 1, 30), 'resumed, the event is delivered');

# --- the look for due endpoint validations
hold('validations-due', 'validations-sent');
$offset = -s $node->logfile;
pause_at('validations-due', 'validations-sent');
ok(waiting_at('validations-due', $offset), 'the upkeep worker began looking for due validations, and waits');
sql("SELECT eventgrid.create_event_subscription('rot', 'validated', '$r->{url}/validate/auto/v', endpoint_validation => 'handshake')");
free('validations-due');
ok(waiting_at('validations-sent', $offset), 'a handshake was sent');
my $passes = () = slurp_file($node->logfile, $offset) =~ /eventgrid: at pause point "validations-due"/g;
is($passes, 1, 'in the same round: the look saw the subscription created after its unit of work began');
free('validations-sent');
sql("ALTER SYSTEM RESET eventgrid.debug_pause_points; SELECT pg_reload_conf()");
ok(wait_for_sql($node, "SELECT provisioning_state FROM eventgrid.event_subscription_validation WHERE subscription = 'validated'", 'Succeeded', 30),
	'the endpoint answered: Succeeded');

# --- the same look racing a queue subscription's references (item 11 of the
# issue: a pull event published with a rotation of 1 s was never
# receivable once): the publisher commits after the first look, and the
# delivery worker makes its event receivable (a reference into the table,
# the position moved past it) before the lock is taken; only the second look
# sees the reference.
sql("SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace')");
sql("SELECT eventgrid.create_event_subscription('jobs', 'workers', delivery_mode => 'queue')");
hold('truncate-lock');
my $job = $node->background_psql('postgres');
$job->query_safe("BEGIN; INSERT INTO eventgrid.events (topic, event) VALUES ('jobs',"
	  . " '{\"specversion\": \"1.0\", \"id\": \"job-1\", \"source\": \"/jobs\", \"type\": \"Job\", \"data\": {}}')");
$offset = -s $node->logfile;
pause_at('truncate-lock');
ok(waiting_at('truncate-lock', $offset), 'queue: the upkeep worker looked at the table and waits before locking it');
$job->query_safe('COMMIT');
$job->quit;
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.queue_batches", '1', 30),
	'queue: meanwhile the delivery worker made the event receivable (a reference into the table)');
my $freed_at = sql("SELECT clock_timestamp()");
free('truncate-lock');
sql("ALTER SYSTEM RESET eventgrid.debug_pause_points; SELECT pg_reload_conf()");
ok(wait_for_sql($node, "SELECT max(last_try_at) > '$freed_at' FROM eventgrid.event_tables", 't', 30),
	'queue: the upkeep worker went on (a later round tried the tables)');
is(sql("SELECT string_agg(event->>'id', ',') FROM eventgrid.receive('jobs', 'workers', 10, 10)"), 'job-1',
	'queue: the event is received (the second look saw its reference; with the first look\'s snapshot, the table was emptied under it)');

# --- the clean cuts of an ordered subscription's batch
# A batch of two overlapping transactions: A (the lower txid) commits 1,100
# events, one of key k, more than a claim takes of one subscription (1,000);
# B (the higher txid) published k's first event before A's, and commits
# after the claim's unit of work began, before its scan.  Every cut of A's
# events leaves B's k event, which has a lower id, behind: the batch goes
# into the retries in id order, k's second event behind its first (the
# receiver answers after 300 ms).  Counted without B, a cut after 1,000 of
# A's events looks clean and k's events arrive the wrong way round.  Run
# twice: with nothing of the subscription in flight, and while an event of
# it is (the batch then waits for that event's outcome to be recorded: it
# stalled until the next publish, found by this test).
my $path = '/status/200/ordered';
sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_event_subscription('orders', 'ordered', '$r->{url}$path?delay_ms=300', ordering_key => 'subject')");
my $delivered = 0;

sub batch_scenario
{
	my ($tag, $in_flight) = @_;
	sql("SELECT eventgrid.publish('orders', '" . eg_event("$tag-w", subject => "/orders/$tag-w") . "')");
	$delivered++;
	if ($in_flight)
	{
		ok(wait_for_sql($node, "SELECT lease_owner IS NOT NULL FROM eventgrid.subscription_positions p"
				  . " JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id WHERE s.name = 'ordered'", 't'),
			"$tag: an event of the subscription is in flight (300 ms)");
	}
	else
	{
		ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'ordered'", $delivered),
			"$tag: nothing of the subscription in flight");
	}
	hold('claim-begin', 'claim-scan');
	my $offset = -s $node->logfile;
	pause_at('claim-begin', 'claim-scan');
	my $ta = $node->background_psql('postgres');
	my $tb = $node->background_psql('postgres');
	my $txa = $ta->query_safe('BEGIN; SELECT pg_current_xact_id()');
	$tb->query_safe("BEGIN; SELECT eventgrid.publish('orders', '" . eg_event("$tag-k1", subject => "/orders/$tag-k") . "')");
	my $txb = $tb->query_safe('SELECT pg_current_xact_id()');
	$ta->query_safe("SELECT eventgrid.publish('orders', jsonb_build_array(jsonb_build_object('id', '$tag-k2', 'subject', '/orders/$tag-k',"
		  . " 'eventType', 'Shop.OrderCreated', 'eventTime', '2024-05-01T12:00:00Z', 'data', '{}'::jsonb))"
		  . " || (SELECT jsonb_agg(jsonb_build_object('id', '$tag-f' || i, 'subject', '/orders/$tag-f' || i, 'eventType', 'Shop.OrderCreated',"
		  . "     'eventTime', '2024-05-01T12:00:00Z', 'data', '{}'::jsonb)) FROM generate_series(1, 1099) i))");
	$ta->query_safe('COMMIT');
	$ta->quit;
	cmp_ok($txa, '<', $txb, "$tag: A has the lower txid ($txa < $txb), B k's first event");
	ok(waiting_at('claim-begin', $offset), "$tag: the delivery worker waits before its claim");
	$offset = -s $node->logfile;
	free('claim-begin');
	ok(waiting_at('claim-scan', $offset), "$tag: its claim began (A committed, B not), and waits before its scan");
	$tb->query_safe('COMMIT');
	$tb->quit;
	free('claim-scan');
	sql("ALTER SYSTEM RESET eventgrid.debug_pause_points; SELECT pg_reload_conf()");
	$delivered += 1101;
	ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'ordered'", $delivered, 120),
		"$tag: every event delivered");
	my @k = grep { decode_json($_->{body})->[0]{id} =~ /^$tag-k/ } requests($r, $path);
	is(join(',', map { decode_json($_->{body})->[0]{id} } @k), "$tag-k1,$tag-k2", "$tag: key k's events in publish order");
	cmp_ok($k[1]{time} - $k[0]{time}, '>=', 0.25,
		"$tag: k2 was sent only after k1's answer (300 ms): moved into the retries, it waited behind its key's head");
}
batch_scenario('settled', 0);
batch_scenario('in-flight', 1);

$holder->quit;
$node->stop;
done_testing();
