# Delivery attempt history and metrics: one row per attempt in
# eventgrid.delivery_attempts (a batch names all its events, with the ids
# publish() returned), retries with their attempt numbers and statuses,
# libcurl's error text when there was no HTTP answer, durations; the
# eventgrid.attempt_history modes; rotation of the three history tables by
# row count and by age, and a rotation that waits for a lock; the
# eventgrid.metrics view with Event Grid's names.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('history');
my $r = start_receiver();
my $u = $r->{url};

sub sql { return $node->safe_psql('postgres', shift) }

sub publish
{
	my ($topic, @ids) = @_;
	my $events = '[' . join(',', map { eg_event($_) } @ids) . ']';
	my $got = sql("SELECT eventgrid.publish('$topic', '$events')");
	$got =~ s/[{}]//g;
	return $got;
}

sub attempts_of
{
	my ($sub) = @_;
	return sql("SELECT string_agg(attempt || ':' || coalesce(http_status::text, '-') || ':' || outcome, ' ' ORDER BY attempt)"
		  . " FROM eventgrid.delivery_attempts WHERE subscription = '$sub'");
}

sub metric
{
	my ($topic, $sub, $name, $aggregation) = @_;
	my $who = defined $sub ? "event_subscription = '$sub'" : 'event_subscription IS NULL';
	$aggregation //= 'Total';
	return sql("SELECT value FROM eventgrid.metrics WHERE topic = '$topic' AND $who"
		  . " AND metric_name = '$name' AND aggregation = '$aggregation'");
}

# --- an endpoint that fails twice, then accepts
sql("SELECT eventgrid.create_topic('shop')");
sql("SELECT eventgrid.create_event_subscription('shop', 'flaky', '$u/seq/500,503,200/flaky')");
my $flaky_id = publish('shop', 'f-1');
wait_recorded($node, 'flaky', 1);
advance_clock($node, 11);
wait_recorded($node, 'flaky', 2);
advance_clock($node, 31);
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'flaky'", '1'),
	'flaky: delivered at the third attempt');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'flaky'", '3'),
	'flaky: three attempts in the history');
is(attempts_of('flaky'), '1:500:GenericError 2:503:Busy 3:200:Delivered', 'flaky: attempt numbers, statuses, outcomes');
is(sql("SELECT string_agg(DISTINCT event_ids::text, ' ') FROM eventgrid.delivery_attempts WHERE subscription = 'flaky'"),
	"{$flaky_id}", 'flaky: each attempt names the id publish() returned');
is(sql("SELECT bool_and(topic = 'shop' AND error IS NULL AND duration_ms >= 0) FROM eventgrid.delivery_attempts"
	  . " WHERE subscription = 'flaky'"), 't', 'flaky: topic, a duration, no transport error');
my @flaky = requests($r, '/seq/500,503,200/flaky');
is(join(',', map { $_->{headers}{'aeg-delivery-count'} } @flaky), '0,1,2',
	'flaky: the history\'s attempt numbers are aeg-delivery-count plus one');

# --- a batch: one attempt naming all its events
sql("SELECT eventgrid.create_topic('bulk')");
sql("SELECT eventgrid.create_event_subscription('bulk', 'batched', '$u/batched', max_events_per_batch => 3)");
my $bulk_ids = publish('bulk', 'b-1', 'b-2', 'b-3');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'batched'", '3'),
	'batch: delivered');
is(sql("SELECT count(*) || ' ' || string_agg(array_to_string(event_ids, ','), ' ') || ' ' || min(attempt)"
	  . " FROM eventgrid.delivery_attempts WHERE subscription = 'batched'"),
	"1 $bulk_ids 1", 'batch: one attempt with the three event ids');

# --- no HTTP answer: libcurl's message; a slow endpoint: its duration
my $closed = PostgreSQL::Test::Cluster::get_free_port();
sql("SELECT eventgrid.create_topic('edge')");
sql("SELECT eventgrid.create_event_subscription('edge', 'refused', 'http://127.0.0.1:$closed/x',"
	  . " max_delivery_attempts => 1, deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('edge', 'slow', '$u/slow?delay_ms=300')");
publish('edge', 'e-1');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.delivery_attempts WHERE topic = 'edge'", '2'),
	'edge: both attempts recorded');
my ($status, $outcome, $error) = split /\|/,
  sql("SELECT coalesce(http_status::text, 'null'), outcome, error FROM eventgrid.delivery_attempts WHERE subscription = 'refused'");
is("$status $outcome", 'null SocketError', 'refused: no status, outcome SocketError');
# (libcurl 7.88 names "port N", 8.x "127.0.0.1:N")
like($error, qr/(port |:)$closed\b.*(refused|connect)/i, "refused: libcurl's error text ($error)");
cmp_ok(sql("SELECT duration_ms FROM eventgrid.delivery_attempts WHERE subscription = 'slow'"), '>=', 300,
	'slow: the duration covers the endpoint\'s 300 ms');

# --- metrics with Event Grid's names
sql("SELECT eventgrid.create_topic('quiet')");
sql("SELECT eventgrid.create_event_subscription('quiet', 'picky', '$u/picky', included_event_types => ARRAY['Other.Type'])");
publish('quiet', 'q-1', 'q-2');
sql("SELECT eventgrid.create_event_subscription('edge', 'dropping', 'http://127.0.0.1:$closed/y', max_delivery_attempts => 1)");
publish('edge', 'e-2');
ok(wait_for_sql($node, "SELECT dead_lettered || '/' || dropped FROM eventgrid.delivery_statistics"
	  . " WHERE subscription IN ('refused', 'dropping') ORDER BY subscription", "0/1\n2/0"),
	'edge: dead-lettered and dropped');
ok(wait_for_sql($node, "SELECT value FROM eventgrid.metrics WHERE topic = 'quiet' AND metric_name = 'UnmatchedEventCount'", '2'),
	'metrics: UnmatchedEventCount');
is(metric('quiet', undef, 'PublishSuccessCount'), '2', 'metrics: PublishSuccessCount of a topic');
ok(wait_for_sql($node, "SELECT value FROM eventgrid.metrics WHERE topic = 'edge' AND event_subscription IS NULL"
	  . " AND metric_name = 'PublishSuccessCount'", '2'), 'metrics: PublishSuccessCount of another topic');
is(metric('shop', 'flaky', 'MatchedEventCount'), '1', 'metrics: MatchedEventCount');
is(metric('shop', 'flaky', 'DeliverySuccessCount'), '1', 'metrics: DeliverySuccessCount');
is(metric('shop', 'flaky', 'DeliveryAttemptFailCount'), '2', 'metrics: DeliveryAttemptFailCount');
is(metric('bulk', 'batched', 'MatchedEventCount') . ' ' . metric('bulk', 'batched', 'DeliverySuccessCount'), '3 3',
	'metrics: a batch counts its events');
is(metric('edge', 'refused', 'DeadLetteredCount') . ' ' . metric('edge', 'dropping', 'DroppedEventCount'), '2 1',
	'metrics: DeadLetteredCount and DroppedEventCount');
is(metric('quiet', 'picky', 'MatchedEventCount'), '0', 'metrics: nothing matched a filter that takes nothing');
cmp_ok(metric('edge', 'slow', 'DestinationProcessingDurationInMs', 'Average'), '>=', 300,
	'metrics: DestinationProcessingDurationInMs average');
cmp_ok(metric('edge', 'slow', 'DestinationProcessingDurationInMs', 'P95'), '>=', 300,
	'metrics: DestinationProcessingDurationInMs p95');
is(metric('edge', 'refused', 'DestinationProcessingDurationInMs', 'Average'), '',
	'metrics: no duration without an HTTP answer');

# --- eventgrid.attempt_history = failures, then off
sub set_mode
{
	my ($mode) = @_;
	sql("ALTER SYSTEM SET eventgrid.attempt_history = '$mode'; SELECT pg_reload_conf()");
	ok(wait_for_sql($node, "SELECT setting FROM pg_settings WHERE name = 'eventgrid.attempt_history'", $mode),
		"attempt_history set to $mode");
	sleep 1;    # the worker has read the reloaded file
}
my $before = sql("SELECT count(*) FROM eventgrid.delivery_attempts");
set_mode('failures');
publish('edge', 'e-3');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'slow'", '3'),
	'failures: delivered');
ok(wait_for_sql($node, "SELECT dead_lettered FROM eventgrid.delivery_statistics WHERE subscription = 'refused'", '3'),
	'failures: dead-lettered');
ok(wait_for_sql($node, "SELECT count(*) - $before FROM eventgrid.delivery_attempts", '2'),
	'failures: the two failed attempts are kept');
is(sql("SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'slow'"), '2',
	'failures: the delivered one is not');
set_mode('off');
$before = sql("SELECT count(*) FROM eventgrid.delivery_attempts");
publish('edge', 'e-4');
ok(wait_for_sql($node, "SELECT dead_lettered FROM eventgrid.delivery_statistics WHERE subscription = 'refused'", '4'),
	'off: dead-lettered');
is(sql("SELECT count(*) - $before FROM eventgrid.delivery_attempts"), '0', 'off: nothing kept');
set_mode('all');

# --- rotation by rows: a table takes half of attempt_history_max_rows
$node->append_conf('postgresql.conf', "eventgrid.attempt_history_max_rows = 1000\n");
$node->reload;
sql("SELECT eventgrid.create_topic('many')");
sql("SELECT eventgrid.create_event_subscription('many', 'each', '$u/each')");
my $delivered = 0;
sub burst
{
	my ($tag) = @_;
	sql("SELECT eventgrid.publish('many', (SELECT jsonb_agg(jsonb_build_object('id', '$tag-' || i, 'subject', 's',"
		  . " 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', '{}'::jsonb)) FROM generate_series(1, 600) i))");
	$delivered += 600;
	return wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'each'", $delivered);
}
my $table = sql("SELECT history_table FROM eventgrid.attempt_log_rotation");
ok(burst('a'), 'rows: 600 attempts');
my $first_a = sql("SELECT min(id) FROM eventgrid.attempt_log WHERE subscription_name = 'each'");
ok(wait_for_sql($node, "SELECT history_table FROM eventgrid.attempt_log_rotation", ($table + 1) % 3),
	'rows: the next table takes rows once the current one holds 500');
ok(burst('b'), 'rows: 600 more');
ok(wait_for_sql($node, "SELECT history_table FROM eventgrid.attempt_log_rotation", ($table + 2) % 3), 'rows: and the next');
is(sql("SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'each'"), '1200', 'rows: all kept so far');
# (the upkeep worker looks about once a second, so a burst may spill over into the next table)
my $oldest = sql("SELECT count(*) FROM eventgrid.attempt_log_$table WHERE subscription_name = 'each'");
cmp_ok($oldest, '>=', 1, "rows: the oldest table holds $oldest of them");

# a session reading the oldest table holds the rotation back, without waiting
my $reader = $node->background_psql('postgres');
$reader->query_safe("BEGIN; SELECT count(*) FROM eventgrid.attempt_log_$table;");
ok(burst('c'), 'rows: 600 more while a session reads the oldest table');
ok(wait_for_sql($node, "SELECT last_failure FROM eventgrid.attempt_log_rotation",
	'another session holds a lock on the table'), 'rows: the rotation waits, and says why');
is(sql("SELECT history_table FROM eventgrid.attempt_log_rotation"), ($table + 2) % 3, 'rows: not rotated meanwhile');
$reader->query_safe('COMMIT');
$reader->quit;
ok(wait_for_sql($node, "SELECT history_table FROM eventgrid.attempt_log_rotation", $table),
	'rows: rotated once the lock is free');
is(sql("SELECT count(*) FROM eventgrid.attempt_log WHERE id = $first_a"), '0', 'rows: the oldest table was emptied');
is(sql("SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'each'"), 1800 - $oldest,
	'rows: the two newer tables are kept');
is(sql("SELECT last_failure IS NULL FROM eventgrid.attempt_log_rotation"), 't', 'rows: no failure left');

# --- rotation by age: half of attempt_history_retention on the worker's clock
$node->append_conf('postgresql.conf', "eventgrid.attempt_history_retention = '1h'\n");
$node->reload;
$table = sql("SELECT history_table FROM eventgrid.attempt_log_rotation");
my $kept = sql("SELECT count(*) FROM eventgrid.delivery_attempts");
$oldest = sql("SELECT count(*) FROM eventgrid.attempt_log_" . (($table + 1) % 3));
cmp_ok($oldest, '>=', 1, "age: the oldest table holds $oldest attempts");
advance_clock($node, 1801);
ok(wait_for_sql($node, "SELECT history_table FROM eventgrid.attempt_log_rotation", ($table + 1) % 3),
	'age: the next table takes rows after half the retention');
is(sql("SELECT count(*) FROM eventgrid.delivery_attempts"), $kept - $oldest, 'age: the oldest attempts are gone');

# --- one clock: with eventgrid.clock_offset set, a dead letter's publish,
# attempt and dead-letter times and its attempt history all come from the
# worker's clock (the real one moved ahead by the offset)
my $offset = advance_clock($node, 0);
sql("SELECT eventgrid.create_topic('clock')");
sql("SELECT eventgrid.create_event_subscription('clock', 'clock', '$u/status/400/clock', deadletter => true)");
my $real = sql("SELECT extract(epoch FROM clock_timestamp())");
publish('clock', 'c-1');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'clock'", '1'),
	'clock: a 400 is dead-lettered at once');
my @times = split /\|/, sql("SELECT extract(epoch FROM d.publish_time), extract(epoch FROM d.last_delivery_attempt_time),"
	  . " extract(epoch FROM d.dead_lettered_at), (SELECT extract(epoch FROM a.attempted_at) FROM eventgrid.delivery_attempts a"
	  . " WHERE a.subscription = 'clock') FROM eventgrid.dead_letters d WHERE d.subscription_name = 'clock'");
is(scalar(grep { $_ - $real > $offset - 1 && $_ - $real < $offset + 10 } @times), 4,
	"clock: publish, attempt, dead-letter and history times are all $offset s ahead of the real clock (@times; real $real)");

$node->stop;
done_testing();
