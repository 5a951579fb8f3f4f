# Editing an event subscription in place (issue "Operate without a
# superuser", item 1): eventgrid.update_event_subscription() as the admin
# role keeps the position, the retries and the first attempts waiting;
# the next claim uses the new endpoint (with its own health state),
# filters, batching and delivery schema; a NULL argument keeps a setting,
# an empty value clears it; bad values are refused as at creation.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;

# No rotation: a paused subscription's events become its retries when the
# rotation empties their table (README), which the counts below would see
# if a turn of the default 10 s ended just after they were published.
my $node = new_node('update', 'eventgrid.event_table_rotation' => "'1h'");
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }
sub ops { return $node->safe_psql('postgres', "SET ROLE ops; " . shift) }

sub fails { return sql_error($node, @_) }

sub publish
{
	my ($prefix, $n, %extra) = @_;
	sql("SELECT eventgrid.publish('work', '[" . join(',', map { eg_event("$prefix-$_", %extra) } 1 .. $n) . "]')");
}

sub settings
{
	return sql("SELECT row(s.*)::text FROM eventgrid.event_subscriptions s WHERE s.name = 'sub-u'");
}

# three failures in a row put an endpoint on probation
sql("ALTER SYSTEM SET eventgrid.probation_failures = 3; SELECT pg_reload_conf()");
sql("CREATE ROLE ops LOGIN IN ROLE eventgrid_admin; CREATE ROLE app LOGIN IN ROLE eventgrid_publisher");
sql("SELECT eventgrid.create_topic('work')");
sql("SELECT eventgrid.create_event_subscription('work', 'sub-u', '$u/status/500/old', deadletter => true,"
	  . " included_event_types => ARRAY['Shop.OrderCreated', 'Shop.OrderPaid'])");

# --- retries and waiting events are kept, and go to the new endpoint
publish('r', 3);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries WHERE attempts = 1 AND lease_owner IS NULL", '3'),
	'three events failed once at the old endpoint and wait for a retry');
ok(wait_for_sql($node, "SELECT state FROM eventgrid.endpoint_states WHERE endpoint LIKE '%/old'", 'probation'),
	'and put the old endpoint on probation');
ops("SELECT eventgrid.pause_delivery('work', 'sub-u')");
publish('w', 2);
my $before = settings();
ops("SELECT eventgrid.update_event_subscription('work', 'sub-u', endpoint => '$u/status/200/new')");
my $after = settings();
(my $expected = $before) =~ s{\Q$u/status/500/old\E}{$u/status/200/new};
is($after, $expected, 'only the endpoint changed: every NULL argument kept its setting');
is(sql("SELECT count(*) || ' retries, ' || sum(attempts) || ' attempts' FROM eventgrid.retries"), '3 retries, 3 attempts',
	'the retries are kept with their attempts');
ops("SELECT eventgrid.resume_delivery('work', 'sub-u')");
is(scalar(wait_for_requests($r, '/status/200/new', 2)), 2,
	'the two events that waited at the position go to the new endpoint at once: its own health state, not on probation');
advance_clock($node, 15);
my @new = wait_for_requests($r, '/status/200/new', 5);
is(scalar(@new), 5, 'the three retries, once due, go to the new endpoint');
is(join(',', sort map { $json->decode($_->{body})->[0]{id} } @new), 'r-1,r-2,r-3,w-1,w-2', 'every event, once');
is(scalar(requests($r, '/status/500/old')), 3, 'the old endpoint got only the first attempts');
ok(wait_for_sql($node, "SELECT delivered || '/' || pending FROM eventgrid.delivery_statistics", '5/0'), 'all delivered');
is(sql("SELECT string_agg(attempt || ':' || count, ',' ORDER BY attempt) FROM (SELECT attempt, count(*)"
		  . " FROM eventgrid.delivery_attempts WHERE outcome = 'Delivered' GROUP BY attempt) a"), '1:2,2:3',
	'the retries delivered at the new endpoint were their events\' second attempts');
is(scalar(requests($r, '/status/500/old')), 3, 'the old endpoint, on probation, got nothing more');
# --- filters: a changed type list, then cleared with an empty array
ops("SELECT eventgrid.update_event_subscription('work', 'sub-u', included_event_types => ARRAY['Shop.OrderPaid'])");
publish('f', 2);
publish('p', 1, eventType => 'Shop.OrderPaid');
my @f = wait_for_requests($r, '/status/200/new', 6);
sleep 1;
@f = requests($r, '/status/200/new');
is($json->decode($f[-1]{body})->[0]{id}, 'p-1', 'the new filter takes the paid event');
is(scalar(@f), 6, 'and leaves out the two created ones');
ops("SELECT eventgrid.update_event_subscription('work', 'sub-u', included_event_types => '{}', subject_begins_with => '/orders/')");
is(sql("SELECT coalesce(included_event_types::text, 'NULL') || ' ' || subject_begins_with FROM eventgrid.event_subscriptions"),
	'NULL /orders/', 'an empty array clears the type filter; a subject filter is set');
ops("SELECT eventgrid.update_event_subscription('work', 'sub-u', subject_begins_with => '')");
is(sql("SELECT coalesce(subject_begins_with, 'NULL') FROM eventgrid.event_subscriptions"), 'NULL', "'' clears it");

# --- batching on, then a new delivery schema with a retry pending
ops("SELECT eventgrid.update_event_subscription('work', 'sub-u', max_events_per_batch => 10)");
publish('b', 4);
my @b = wait_for_requests($r, '/status/200/new', 7);
is(scalar(@{ $json->decode($b[-1]{body}) }), 4, 'batching on: four events in one request');
ops("SELECT eventgrid.update_event_subscription('work', 'sub-u', endpoint => '$u/seq/500,200/cloud')");
publish('c', 1);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries WHERE attempts = 1 AND lease_owner IS NULL", '1'),
	'an event failed once and waits for a retry');
ops("SELECT eventgrid.update_event_subscription('work', 'sub-u', event_delivery_schema => 'CloudEventSchemaV1_0',"
	  . " max_events_per_batch => 0)");
is(sql("SELECT coalesce(max_events_per_batch::text, 'NULL') FROM eventgrid.event_subscriptions"), 'NULL',
	'0 clears max_events_per_batch: batching off');
advance_clock($node, 15);
my @c = wait_for_requests($r, '/seq/500,200/cloud', 2);
my $first = $json->decode($c[0]{body});
my $retry = $json->decode($c[1]{body});
is($first->[0]{id}, 'c-1', 'the first attempt went in the Event Grid schema, batched');
is(ref($retry) . ' ' . $retry->{specversion} . ' ' . $retry->{id}, 'HASH 1.0 c-1',
	'the retry went as a CloudEvent, alone: the new schema and batching apply to kept retries');

# --- retry policy, profile checks and refusals, as at creation
ops("SELECT eventgrid.update_event_subscription('work', 'sub-u', max_delivery_attempts => 5, event_ttl => 60)");
is(sql("SELECT max_delivery_attempts || ' ' || event_ttl FROM eventgrid.event_subscriptions"), '5 60', 'retry policy changed');
sql("SELECT eventgrid.create_event_subscription('work', 'sub-v', '$u/status/200/v')");
for my $case (
	[ "endpoint => 'ftp://x/'", "endpoint => 'ftp://x/'" ],
	[ "max_delivery_attempts => 31", "max_delivery_attempts => 31" ],
	[ "max_delivery_count => 3", "max_delivery_count => 3" ],
	[ "event_delivery_schema => 'CustomEventSchema'", "event_delivery_schema => 'CustomEventSchema'" ],
	[ "included_event_types => ARRAY[NULL]", "included_event_types => ARRAY[NULL]" ],
	[ "max_events_per_batch => 5001", "max_events_per_batch => 5001" ],
	[ "advanced_filters => '[{\"operatorType\": \"Nope\", \"key\": \"data.x\"}]'",
	  "advanced_filters => '[{\"operatorType\": \"Nope\", \"key\": \"data.x\"}]'" ])
{
	my $args = $case->[0] =~ /^endpoint => (.*)/ ? $1 : "'$u/x', $case->[0]";
	my $c = fails("SELECT eventgrid.create_event_subscription('work', 'sub-w', $args)", 'ops');
	my $up = fails("SELECT eventgrid.update_event_subscription('work', 'sub-v', $case->[1])", 'ops');
	s/^.*?ERROR:\s+//s, s/\n(CONTEXT|LOCATION).*//s for $c, $up;
	isnt($up, 'no error', "update refuses $case->[1]");
	is($up, $c, "with the error create_event_subscription gives ($case->[1])");
}
is(sql("SELECT endpoint FROM eventgrid.event_subscriptions WHERE name = 'sub-v'"), "$u/status/200/v", 'a refused update changes nothing');
like(fails("SELECT eventgrid.update_event_subscription('work', 'nope')", 'ops'), qr/42704/, 'no such subscription: 42704');
like(fails("SELECT eventgrid.update_event_subscription('work', 'sub-v', endpoint => 'http://x/')", 'app'),
	qr/42501: permission denied for function update_event_subscription/, 'a publisher may not update (42501)');
like(slurp_file($node->logfile), qr/LOG:  eventgrid: endpoint of event subscription "sub-u" of topic "work" changed by ops/,
	'a changed endpoint is logged');
unlike(join('', grep { !/statement: / } split /^/, slurp_file($node->logfile)), qr/status\/200\/new/,
	'without its URL (only the statement log, which the test turned on, shows it)');
unlike(slurp_file($node->logfile), qr/changed by ops\n[^\n]*STATEMENT: /,
	'and without the STATEMENT line PL/pgSQL would add, which holds it');

# --- max_delivery_attempts lowered below the attempts already made (1
# after 2), or to exactly those (2 after 2): the waiting retry is not sent
# again, it is dead-lettered when it comes due
for my $case ([ 'lowered', 1 ], [ 'exact', 2 ])
{
	my ($name, $to) = @$case;
	sql("SELECT eventgrid.create_event_subscription('work', '$name', '$u/status/500/$name', deadletter => true,"
		  . " subject_begins_with => '/$name')");
	sql("SELECT eventgrid.publish('work', '" . eg_event("$name-1", subject => "/$name/1") . "')");
	ok(wait_recorded($node, $name, 1), "$name: the first attempt failed");
	advance_clock($node, 15);
	ok(wait_recorded($node, $name, 2), "$name: and the second");
	ops("SELECT eventgrid.update_event_subscription('work', '$name', max_delivery_attempts => $to)");
	advance_clock($node, 40);
	ok(wait_for_sql($node, "SELECT dead_letter_reason || ' ' || delivery_attempts FROM eventgrid.dead_letters"
		  . " WHERE subscription_name = '$name'", 'MaxDeliveryAttemptsExceeded 2', 30),
		"$name to $to after 2 attempts: dead-lettered MaxDeliveryAttemptsExceeded when the retry came due");
	is(scalar(requests($r, "/status/500/$name")), 2, "$name: with no third request sent");
}

$node->stop;
done_testing();
