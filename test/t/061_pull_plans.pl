# Pull delivery's statements keep their plans whatever the statistics say
# (issue "Ordered and pull delivery at their peers' speed", item 2; 0.17.0).
# The queue is analyzed while empty, then 100,000 events arrive (autovacuum
# off: the statistics stay those of the empty queue, as when a backlog
# builds up between two ANALYZEs).  With such statistics the planner
# believes a queue subscription has a few rows, and 0.16.0's statements
# then read every receivable event for each call: receive() a bitmap scan
# of the whole subscription sorted, acknowledge() and the other operations
# the subscription's entries of the receivable index beside the events they
# settle.  What each call reads is counted by the backend's own statistics
# of its transaction (pg_stat_get_xact_tuples_returned: index entries
# returned; pg_stat_get_xact_tuples_fetched of the table: rows a bitmap
# scan fetched), which no other process adds to:
#
#  - receive(100) reads about its 100 entries of the receivable index and
#    fetches about 100 events, not 100,000;
#  - acknowledge(), release(), renew_locks() and reject() of their tokens,
#    and the results of tokens that settle nothing, read no entry of the
#    receivable index (each event found by primary key);
#  - lock tokens are checked as receive() writes them: a secret in upper
#    case and an id with leading zeros settle their events, a secret with
#    a letter that is not hexadecimal or an id of 19 digits is no token;
#  - what was received, acknowledged, released, renewed and rejected is
#    what the counts say;
#  - no event is copied (0.21.0): the backlog is 1,000 rows of references
#    (eventgrid.queue_batches), and queue_events holds only a lock row,
#    without the event, for each event received and not settled.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $backlog = 100000;
my $node = new_node('pullplans', autovacuum => 'off');
sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace')");
sql("SELECT eventgrid.create_event_subscription('jobs', 'job-queue', delivery_mode => 'queue', receive_lock_duration => 300)");
sql("VACUUM ANALYZE eventgrid.queue_events");
is(sql("SELECT reltuples <= 0 FROM pg_class WHERE oid = 'eventgrid.queue_events'::regclass"), 't',
	'the queue was analyzed empty');
sql("INSERT INTO eventgrid.events (topic, event) "
	  . "SELECT 'jobs', jsonb_build_object('specversion', '1.0', 'id', 'j' || g, 'source', '/jobs', 'type', 'Job', "
	  . "'data', jsonb_build_object('n', g)) FROM generate_series(1, $backlog) g");
ok($node->poll_query_until('postgres',
		"SELECT receivable_events = $backlog FROM eventgrid.queue_metrics WHERE event_subscription = 'job-queue'"),
	"the delivery workers moved $backlog events into the queue");
is(sql("SELECT reltuples <= 0 FROM pg_class WHERE oid = 'eventgrid.queue_events'::regclass"), 't',
	'its statistics are still those of the empty queue');
is(sql("SELECT (SELECT count(*) FROM eventgrid.queue_events) || ' ' || (SELECT count(*) FROM eventgrid.queue_batches)"),
	'0 ' . $backlog / 100, 'no event was copied: 100 references a row');

# Runs $call (a query returning one text) in a transaction of its own; returns its result and
# what the transaction read: entries of the receivable index returned, and queue rows fetched.
sub counted
{
	my ($call) = @_;
	my @out = split /\n/, sql("BEGIN; $call; "
		  . "SELECT pg_stat_get_xact_tuples_returned('eventgrid.queue_events_receivable_idx'::regclass) || ' ' "
		  . "    || pg_stat_get_xact_tuples_fetched('eventgrid.queue_events'::regclass); COMMIT");
	my ($entries, $fetched) = split / /, pop @out;
	return (join("\n", @out), $entries, $fetched);
}

sub receive_tokens
{
	my ($n) = @_;
	my ($tokens, $entries, $fetched) =
	  counted("SELECT string_agg(lock_token, ',' ORDER BY lock_token) FROM eventgrid.receive('jobs', 'job-queue', $n, 10)");
	return ([ split /,/, $tokens ], $entries, $fetched);
}

sub tokens_sql { return 'ARRAY[' . join(',', map { "'$_'" } @_) . ']' }

my ($tokens, $entries, $fetched) = receive_tokens(100);
is(scalar @$tokens, 100, 'receive(100) took 100 events');
cmp_ok($entries, '<=', 300, "receive(100) read $entries entries of the receivable index (not the $backlog receivable)");
cmp_ok($fetched, '<=', 300, "receive(100) fetched $fetched rows of the queue by bitmap scans (not the $backlog)");

my ($acked, $ack_entries) =
  counted("SELECT count(*) FILTER (WHERE succeeded) FROM eventgrid.acknowledge('jobs', 'job-queue', " . tokens_sql(@$tokens) . ")");
is($acked, '100', 'acknowledge() settled the 100');
is($ack_entries, '0', 'acknowledge() read no entry of the receivable index');

my ($more) = receive_tokens(40);
my ($released, $rel_entries) =
  counted("SELECT count(*) FILTER (WHERE succeeded) FROM eventgrid.release('jobs', 'job-queue', "
	  . tokens_sql(@$more[0 .. 9]) . ", 10)");
is($released, '10', 'release() settled 10');
is($rel_entries, '0', 'release() read no entry of the receivable index');
my ($renewed, $ren_entries) =
  counted("SELECT count(*) FILTER (WHERE succeeded) FROM eventgrid.renew_locks('jobs', 'job-queue', " . tokens_sql(@$more[10 .. 19]) . ")");
is($renewed, '10', 'renew_locks() renewed 10');
is($ren_entries, '0', 'renew_locks() read no entry of the receivable index');
my ($rejected, $rej_entries) =
  counted("SELECT count(*) FILTER (WHERE succeeded) FROM eventgrid.reject('jobs', 'job-queue', " . tokens_sql(@$more[20 .. 29]) . ")");
is($rejected, '10', 'reject() settled 10');
is($rej_entries, '0', 'reject() read no entry of the receivable index');

# tokens that settle nothing: settled ones again, wrong secrets, and one of another form
my @lost = (@$tokens[0 .. 4], map { (split /:/)[0] . ':00000000-0000-0000-0000-000000000000' } @$more[30 .. 34]);
my ($why, $why_entries) =
  counted("SELECT string_agg(split_part(error, ':', 1), ',') FROM eventgrid.acknowledge('jobs', 'job-queue', "
	  . tokens_sql(@lost, 'not-a-token') . ")");
is($why, join(',', ('TokenLost') x 10, 'InvalidLockToken'), 'tokens that settle nothing say why');
is($why_entries, '0', 'finding why read no entry of the receivable index');

# the tokens' check (src/queue/lock_tokens.c): a secret in upper case and an id with leading zeros
# name their events (compared as receive() wrote them); a secret with a letter that is not
# hexadecimal, or an id of 19 digits, is not a lock token
my ($t_upper, $t_zeros, $t_bad, $t_long) = @$more[35 .. 38];
my ($upper_id, $upper_secret) = split /:/, $t_upper;
my (undef, $long_secret) = split /:/, $t_long;
is(sql("SELECT string_agg(coalesce(split_part(error, ':', 1), succeeded::text), ',') FROM eventgrid.acknowledge('jobs', 'job-queue', "
		  . tokens_sql("$upper_id:" . uc($upper_secret), "000$t_zeros", substr($t_bad, 0, -1) . 'g',
			  "1234567890123456789:$long_secret") . ")"),
	'true,true,InvalidLockToken,InvalidLockToken',
	'upper case and leading zeros settle; a non-hexadecimal secret or a 19-digit id is no token');

is(sql("SELECT received_total || ' ' || acknowledged_total || ' ' || released_total || ' ' || rejected_total FROM eventgrid.queue_metrics "
		  . "WHERE event_subscription = 'job-queue'"),
	'140 102 10 10', 'received, acknowledged, released and rejected as counted');
is(sql("SELECT count(*) || ' ' || count(*) FILTER (WHERE event IS NULL) FROM eventgrid.queue_events"), '28 28',
	'the 28 events received and not settled have a lock row each, none a copy of its event');
is(sql("SELECT sum(cardinality(event_ids)) FROM eventgrid.queue_batches"), $backlog - 140,
	'the others are still receivable, by reference');

done_testing();
