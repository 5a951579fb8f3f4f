# Snapshot batches and the event tables that take turns (issue "Queue
# storage"): a transaction that began long ago and commits late is
# delivered, a rolled-back one never is; the upkeep worker empties event
# tables with TRUNCATE once nothing needs them (not while a slow
# subscription has not passed their events), never waits for a lock, and
# eventgrid.event_tables says what a table waits for.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('tables', 'eventgrid.event_table_rotation' => "'1s'");
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }
sub ids { return [ sort map { $json->decode($_->{body})->[0]{id} } requests($r, '/status/200/t') ] }

ok(start_workers($node), 'work brings the delivery and the upkeep worker');
sql("SELECT eventgrid.create_topic('tbl')");
sql("SELECT eventgrid.create_event_subscription('tbl', 'sub', '$u/status/200/t')");

# --- a publisher that began first and commits last is delivered; a rollback never is
my $late = $node->background_psql('postgres');
$late->query_safe("BEGIN; INSERT INTO eventgrid.events (topic, event) VALUES ('tbl', '" . eg_event('late') . "');");
my $undone = $node->background_psql('postgres');
$undone->query_safe("BEGIN; INSERT INTO eventgrid.events (topic, event) VALUES ('tbl', '" . eg_event('undone') . "');");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'tbl', jsonb_build_object('id', 'e-' || i, 'subject', '/s',"
	  . " 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z') FROM generate_series(1, 5) i");
wait_for_requests($r, '/status/200/t', 5, 30);
sleep 2;    # several batches pass while the early transactions are open
$undone->query_safe('ROLLBACK');
$undone->quit;
$late->query_safe('COMMIT');
$late->quit;
wait_for_requests($r, '/status/200/t', 6, 30);
sleep 1;
is_deeply(ids(), [ 'e-1', 'e-2', 'e-3', 'e-4', 'e-5', 'late' ],
	'the late commit is delivered once, the rolled-back event never');

# --- delivered events leave the event tables: TRUNCATE, no dead rows
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.events", '0', 30), 'the event tables are emptied once passed');
like(sql("SELECT count(*) FILTER (WHERE truncated_at IS NOT NULL) FROM eventgrid.event_tables"), qr/^[1-3]$/,
	'event_tables shows when a table was last emptied');

# --- a table another session holds is left alone, and the view says why
my $reader = $node->background_psql('postgres');
$reader->query_safe("BEGIN; SELECT count(*) FROM eventgrid.events;");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('tbl', '" . eg_event('held') . "')");
is(scalar(wait_for_requests($r, '/status/200/t', 7, 30)), 7, 'delivery goes on while a reader holds the event tables');
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.event_tables WHERE last_failure = 'another session holds a lock on the table'", 't', 30),
	'event_tables: a table held by another session is not emptied, and says so');
is(sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"), '0', 'nobody waits for a lock meanwhile');
$reader->query_safe('COMMIT');
$reader->quit;
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.events", '0', 30), 'emptied once the reader is gone');

# --- a position that has not passed a table's events holds it
sql("ALTER SYSTEM SET eventgrid.delivery_paused = on; SELECT pg_reload_conf()");
sleep 1;
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('tbl', '" . eg_event('paused') . "')");
ok(wait_for_sql($node, "SELECT bool_or(waiting_for @> ARRAY['event subscription sub of topic tbl']) FROM eventgrid.event_tables WHERE NOT current", 't', 30),
	'event_tables: waiting for the subscription that has not passed the events');
is(sql("SELECT pending FROM eventgrid.delivery_statistics"), '1', 'the event waits, counted as pending');
sql("ALTER SYSTEM SET eventgrid.delivery_paused = off; SELECT pg_reload_conf()");
is(scalar(wait_for_requests($r, '/status/200/t', 8, 30)), 8, 'delivered once unpaused');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.events", '0', 30), 'and its table emptied');

# --- while delivery runs, a table whose events a position has not passed is
# not emptied: a subscription limited to 2 events a second takes 6 s for 12
# events, over turns of 1 s
sql("SELECT eventgrid.create_topic('slow')");
sql("SELECT eventgrid.create_event_subscription('slow', 'trickle', '$u/status/200/slow', max_events_per_second => 2)");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'slow', jsonb_build_object('id', 's-' || i, 'subject', '/s',"
	  . " 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z') FROM generate_series(1, 12) i");
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.event_table_rotations"
		  . " WHERE last_failure = 'waiting for event subscription trickle of topic slow'", 't', 30),
	'the upkeep worker leaves the table alone, waiting for the subscription that has not passed its events');
is(scalar(wait_for_requests($r, '/status/200/slow', 12, 60)), 12, 'which gets every event');
is(join(' ', sort { substr($a, 2) <=> substr($b, 2) } map { $json->decode($_->{body})->[0]{id} } requests($r, '/status/200/slow')),
	join(' ', map { "s-$_" } 1 .. 12), 'each once');

$node->stop;
done_testing();
