# Pull delivery reads events where they are (SPEC 14; 0.21.0): no second
# copy of an event on the happy path, copies only when an event table is
# emptied under unsettled events, and the rotation never held up by them.
#   - what becomes visible to a queue subscription is written as references,
#     100 a row (eventgrid.queue_batches), no copy in eventgrid.queue_events;
#   - a receive writes a lock row per event it returns, without the event;
#     acknowledging deletes it, out of order too (a later event settled while
#     an earlier one is still locked);
#   - when the event table holding them is to be emptied, what is still
#     unsettled (never received, locked, released with a delay) gets its
#     copy then, and the table is emptied (the rotation is not held up by a
#     slow consumer): afterwards the events are received in publish order
#     with their content, old lock tokens still settle their events, a
#     rejected event is dead-lettered with its content, a released one comes
#     back after its delay, and every event is received exactly once before
#     it is settled.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# a long turn at first, so that nothing is emptied until the test shortens it
my $node = new_node('pullrotation', 'eventgrid.event_table_rotation' => "'3600s'");
sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace')");
sql("SELECT eventgrid.create_event_subscription('jobs', 'workers', delivery_mode => 'queue', deadletter => true)");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'jobs', jsonb_build_object('specversion', '1.0', 'id', 'j' || g,"
	  . " 'source', '/jobs', 'type', 'Job', 'data', jsonb_build_object('n', g)) FROM generate_series(1, 250) g");
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'workers'", '250'),
	'250 events receivable');

# --- before any rotation: references only
is(sql("SELECT string_agg(cardinality(event_ids)::text, ',' ORDER BY id) FROM eventgrid.queue_batches"), '100,100,50',
	'the delivery workers wrote three rows of references (100 a row)');
is(sql("SELECT count(*) FROM eventgrid.queue_events"), '0', 'and no copy of any event');

# receive() as rows [lock_token, delivery_count, event id]
sub receive
{
	my ($n) = @_;
	return map { [ split /\|/ ] }
	  split /\n/, sql("SELECT lock_token || '|' || delivery_count || '|' || (event->>'id') "
		  . "FROM eventgrid.receive('jobs', 'workers', $n, 10)");
}

sub settle
{
	my ($op, $tokens, $extra) = @_;
	return sql("SELECT string_agg(succeeded::text, ',') FROM eventgrid.$op('jobs', 'workers', ARRAY["
		  . join(',', map { "'$_'" } @$tokens) . "]" . ($extra // '') . ")");
}

my @first = receive(5);
is(join(',', map { $_->[2] } @first), 'j1,j2,j3,j4,j5', 'receive(5) returns the first five, in publish order');
my %tok = map { $_->[2] => $_->[0] } @first;
is(sql("SELECT count(*) || ' ' || count(event) FROM eventgrid.queue_events"), '5 0',
	'a lock row for each, without the event');
is(settle('acknowledge', [ $tok{j3} ]), 'true', 'j3 acknowledged while j2 is still locked (out of order)');
is(settle('release', [ $tok{j1} ], ', 60'), 'true', 'j1 released with a 60 s delay');
is(sql("SELECT count(*) || ' ' || count(event) FROM eventgrid.queue_events"), '4 0', 'still no copy');
is(sql("SELECT sum(cardinality(event_ids)) FROM eventgrid.queue_batches"), '245', '245 not received yet');

# --- the rotation: the event table holding them is emptied under them
my $table = sql("SELECT DISTINCT event_table FROM eventgrid.events WHERE topic = 'jobs'");
sql("ALTER SYSTEM SET eventgrid.event_table_rotation = '1s'; SELECT pg_reload_conf()");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.events_$table", '0', 60),
	"event table events_$table was emptied, with events unsettled (none received, locked, released)");
sql("ALTER SYSTEM SET eventgrid.event_table_rotation = '3600s'; SELECT pg_reload_conf()");
is(sql("SELECT count(*) || ' ' || count(event) || ' ' || count(event_table) FROM eventgrid.queue_events"),
	'249 249 0', 'what was still unsettled got its copy then: the 245, j1, j2, j4, j5');
is(sql("SELECT count(*) FROM eventgrid.queue_batches"), '0', 'no reference is left');
is(sql("SELECT receivable_events || ' ' || locked_events || ' ' || delayed_events FROM eventgrid.queue_metrics"),
	'245 3 1', 'queue_metrics: 245 receivable, 3 locked, 1 delayed');

my @next = receive(100);
is(join(',', map { $_->[2] } @next), join(',', map { "j$_" } 6 .. 105), 'the next 100 come in publish order');
ok(!(grep { $_->[1] ne '1' } @next), 'each received for the first time');
is(sql("SELECT count(*) FROM eventgrid.receive('jobs', 'workers', 100, 10) WHERE event->'data'->>'n' IS NOT NULL"), '100',
	'with their content');
is(settle('acknowledge', [ $tok{j2}, $tok{j5} ]), 'true,true', 'the lock tokens taken before the rotation still settle');
is(settle('reject', [ $tok{j4} ]), 'true', 'j4 rejected');
is(sql("SELECT event->>'id' || ' ' || (event->'data'->>'n') || ' ' || dead_letter_reason FROM eventgrid.dead_letters"),
	'j4 4 Rejected', 'and dead-lettered with its content');
settle('acknowledge', [ map { $_->[0] } @next ]);

# j106-j205 were taken by the count above and not settled; their locks and j1's delay end
advance_clock($node, 61);
my %seen;
for (1 .. 4)
{
	$seen{ $_->[2] } .= $_->[1] for receive(100);
}
is(scalar(keys %seen), 146, 'after the delays: j1, the 100 whose locks expired and the 45 never received');
is(join(',', map { "$_:$seen{$_}" } grep { $seen{$_} ne '1' } sort keys %seen),
	join(',', map { "j$_:2" } sort map { $_ } (1, 106 .. 205)), 'those received before come a second time, the others a first');
is(sql("SELECT count(*) FROM eventgrid.queue_events WHERE receivable_at <= eventgrid._clock_now()"), '0',
	'nothing else is receivable');

done_testing();
