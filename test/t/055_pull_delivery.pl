# Pull delivery (SPEC 14): queue event subscriptions of a namespace topic,
# whose events consumers receive, acknowledge, release, reject and renew
# the locks of in SQL.
#
#  - the settings: delivery_mode and receive_lock_duration refused where
#    they do not apply (22023, 22003), delivery_mode cannot change;
#  - receive() is a long poll: empty after max_wait_time, back soon after
#    the commit that published an event, and while it waits it holds no
#    lock on an event table and costs no CPU (twenty of them, with the event
#    tables rotating every 2 s meanwhile);
#  - acknowledge, release with a delay (the clock moved), reject, renew,
#    expiry of a lock (delivery_count + 1), malformed, expired and settled
#    lock tokens failing only themselves;
#  - max_delivery_count and the time to live dead-letter (also with no
#    consumer: the upkeep worker), reject dead-letters or drops; dead
#    letters redelivered are receivable again;
#  - queue_metrics and delivery_statistics count it all;
#  - eight consumers drain 100,000 events, each acknowledged exactly once;
#  - privileges: eventgrid_receiver calls the operations and nothing else,
#    a publisher none of them, administrators never read lock tokens;
#  - the Azure SDK's CloudEvent model parses what receive() returns.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = new_node('pull', 'eventgrid.event_table_rotation' => "'2s'");
my $json = JSON::PP->new->canonical;

sub sql { return $node->safe_psql('postgres', shift) }
# the event of a row q of eventgrid.queue_events: read in the event tables, or copied there
# when its event table was emptied
my $queued_event = "coalesce(q.event, (SELECT e.event FROM eventgrid.events e WHERE e.id = q.event_id))";
sub fails { return sql_error($node, @_) }

sub cloud_event
{
	my ($id, %extra) = @_;
	return $json->encode({ specversion => '1.0', id => $id, source => '/shop', type => 'Shop.OrderCreated',
		subject => "/orders/$id", data => { orderId => $id }, %extra });
}

sub publish
{
	my ($topic, @ids) = @_;
	my $events = join(',', map { cloud_event($_) } @ids);
	sql("SELECT eventgrid.publish('$topic', '[$events]')");
}

# each queue subscription has a namespace topic of its own
my %topic = ('q-main' => 'orders', 'q-ttl' => 'expiring', 'q-drop' => 'dropping', 'q-drain' => 'bulk');

# receive() as rows [lock_token, delivery_count, event id]
sub receive
{
	my ($sub, $max, $wait) = @_;
	$wait //= 10;
	my $out = sql("SELECT lock_token || ' ' || delivery_count || ' ' || (event->>'id')"
		  . " FROM eventgrid.receive('$topic{$sub}', '$sub', $max, $wait)");
	return map { [ split / / ] } grep { $_ ne '' } split /\n/, $out;
}

sub op
{
	my ($op, $sub, $tokens, $extra) = @_;
	my $arr = 'ARRAY[' . join(',', map { "'$_'" } @$tokens) . ']::text[]';
	return sql("SELECT succeeded || ' ' || coalesce(error, '') FROM eventgrid.$op('$topic{$sub}', '$sub', $arr"
		  . ($extra // '') . ")");
}

sub metric
{
	my ($sub, $col) = @_;
	return sql("SELECT $col FROM eventgrid.queue_metrics WHERE event_subscription = '$sub'");
}

sql("SELECT eventgrid.create_topic('$_', 'CloudEventSchemaV1_0', 'namespace')") for qw(orders expiring dropping bulk);
sql("SELECT eventgrid.create_topic('custom', 'CloudEventSchemaV1_0')");

# --- settings
like(fails("SELECT eventgrid.create_event_subscription('custom', 'q-custom', delivery_mode => 'queue')"),
	qr/22023.*queue event subscriptions are for namespace topics only/, 'a queue subscription needs a namespace topic');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'q-url', 'http://127.0.0.1:1/x', delivery_mode => 'queue')"),
	qr/22023.*a queue event subscription has no endpoint/, 'a queue subscription has no endpoint');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'q-lock', delivery_mode => 'queue', receive_lock_duration => 30)"),
	qr/22003.*receive_lock_duration must be between 60 and 300 seconds, got 30/, 'receive_lock_duration 60-300');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'q-batch', delivery_mode => 'queue', max_events_per_batch => 10)"),
	qr/22023.*settings of push event subscriptions only/, 'batching is for push');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'q-mode', delivery_mode => 'pull')"),
	qr/22023.*delivery_mode must be push or queue, got "pull"/, 'delivery_mode push or queue');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'p-lock', 'http://127.0.0.1:1/x', receive_lock_duration => 60)"),
	qr/22023.*receive_lock_duration is a setting of queue event subscriptions only/, 'no lock duration for push');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'p-none')"),
	qr/22004.*endpoint must not be NULL for a push event subscription/, 'push still needs an endpoint');
sql("SELECT eventgrid.create_event_subscription('orders', 'q-main', delivery_mode => 'queue', deadletter => true,"
	  . " max_delivery_count => 3)");
is(sql("SELECT delivery_mode || ' ' || receive_lock_duration || ' ' || coalesce(endpoint, '-') FROM eventgrid.event_subscriptions"
		  . " WHERE name = 'q-main'"), 'queue 60 -', 'created: queue, a 60 s lock by default, no endpoint');
like(fails("SELECT eventgrid.update_event_subscription('orders', 'q-main', 'http://127.0.0.1:1/x')"),
	qr/22023.*is a queue event subscription: it has no endpoint/, 'delivery_mode cannot change');
sql("SELECT eventgrid.update_event_subscription('orders', 'q-main', receive_lock_duration => 120)");
sql("SELECT eventgrid.update_event_subscription('orders', 'q-main', receive_lock_duration => 60)");
like(fails("SELECT * FROM eventgrid.receive('orders', 'q-main', 101)"), qr/22003.*max_events must be between 1 and 100/,
	'max_events 1-100');
like(fails("SELECT * FROM eventgrid.receive('orders', 'q-main', 1, 5)"), qr/22003.*max_wait_time must be between 10 and 120 seconds/,
	'max_wait_time 10-120');
like(fails("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT * FROM eventgrid.receive('orders', 'q-main')"),
	qr/0A000.*cannot wait in a REPEATABLE READ/, 'READ COMMITTED only');
sql("SELECT eventgrid.create_event_subscription('orders', 'push-sub', 'http://127.0.0.1:1/x')");
like(fails("SELECT * FROM eventgrid.receive('orders', 'push-sub')"), qr/42809.*delivers by push, not from a queue/,
	'a push subscription cannot be received from');
sql("SELECT eventgrid.drop_event_subscription('orders', 'push-sub')");

# --- the long poll: empty after its wait, back at once after a commit
my $t0 = time;
is(scalar(receive('q-main', 1, 10)), 0, 'nothing published: receive() returns no row');
my $waited = time - $t0;
ok($waited >= 9.9 && $waited < 15, "after its max_wait_time of 10 s ($waited s)");

# the delivery workers start with the first event published
publish('orders', 'e0');
my @warm = receive('q-main', 1, 30);
is($warm[0][2], 'e0', 'the first event published is received');
op('acknowledge', 'q-main', [ $warm[0][0] ]);
my ($out, $err) = ('', '');
my $h = IPC::Run::start([ 'psql', '-X', '-At', '-d', $node->connstr('postgres'), '-c',
	"SELECT event->>'id' FROM eventgrid.receive('orders', 'q-main', 10, 60)" ], '>', \$out, '2>', \$err);
sleep 1;
$t0 = time;
publish('orders', 'e1');
$h->finish;
my $latency = time - $t0;
is($out, "e1\n", 'a waiting receive() returns the event published meanwhile');
ok($latency < 2, sprintf('soon after the commit (%.0f ms from before the publishing psql started)', $latency * 1000));
diag(sprintf('commit to receive: %.1f ms (with the publishing psql\'s start)', $latency * 1000));
# e1 is locked now by that receive: its lock expires after 60 s (below)

# --- receive, acknowledge, malformed and settled tokens
publish('orders', map { "a$_" } 1 .. 5);
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'q-main'", '5'),
	'five events receivable');
my @got = receive('q-main', 3);
is(join(',', map { "$_->[2]:$_->[1]" } @got), 'a1:1,a2:1,a3:1', 'receive(max_events 3): the oldest three, delivery_count 1');
like($got[0][0], qr/^[0-9]+:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
	'a lock token is the event\'s queue id and a random (version 4) UUID');
(my $forged = $got[0][0]) =~ s/:.*/:00000000-0000-4000-8000-000000000000/;
is(op('acknowledge', 'q-main', [ $forged ]),
	'false TokenLost: no such lock; the event was settled, received again after its lock expired, or belongs to another event subscription',
	'acknowledge: the right id with a forged secret, alone, fails');
is(op('renew_locks', 'q-main', [ $forged ]),
	'false TokenLost: no such lock; the event was settled, received again after its lock expired, or belongs to another event subscription',
	'so does renew_locks');
is(metric('q-main', 'locked_events'), '4', 'and the locks stay (a1-a3, and e1 from before)');
is(op('acknowledge', 'q-main', [ $forged, $got[0][0], $got[0][0], 'not-a-token' ]),
	"false TokenLost: no such lock; the event was settled, received again after its lock expired, or belongs to another event subscription\n"
	  . "true \nfalse TokenLost: the same lock token came earlier in this call\n"
	  . "false InvalidLockToken: not a lock token of eventgrid.receive()",
	'acknowledge: one row per token, in order; the right id with a forged secret fails, the good one succeeds');
is(op('acknowledge', 'q-main', [ $got[0][0] ]), 'false TokenLost: no such lock; the event was settled, received again after its lock expired, or belongs to another event subscription',
	'an acknowledged event cannot be settled again');

# --- release: at once, or after a delay on the workers' clock
is(op('release', 'q-main', [ $got[1][0] ]), 'true ', 'release a2 (no delay)');
like(fails("SELECT * FROM eventgrid.release('orders', 'q-main', ARRAY['$got[2][0]'], 5)"),
	qr/22023.*release_delay must be 0, 10, 60, 600 or 3600 seconds, got 5/, 'release delays are Event Grid\'s');
is(op('release', 'q-main', [ $got[2][0] ], ', 10'), 'true ', 'release a3 with a 10 s delay');
@got = receive('q-main', 10);
is(join(',', map { "$_->[2]:$_->[1]" } @got), 'a2:2,a4:1,a5:1', 'a2 again (delivery_count 2), a4, a5; a3 waits for its delay');
my %tok = map { $_->[2] => $_->[0] } @got;
advance_clock($node, 11);
@got = receive('q-main', 10);
is(join(',', map { "$_->[2]:$_->[1]" } @got), 'a3:2', 'after 10 s on the workers\' clock a3 is receivable again');
is(op('acknowledge', 'q-main', [ $got[0][0] ]), 'true ', 'a3 acknowledged');

# --- renew and expiry of locks (60 s)
advance_clock($node, 40);
is(op('renew_locks', 'q-main', [ $tok{a4} ]), 'true ', 'a4\'s lock renewed 51 s after its receive');
advance_clock($node, 15);
is(op('renew_locks', 'q-main', [ $tok{a5} ]), 'false TokenLost: the lock expired; the event can be received again',
	'an expired lock is not renewed');
is(op('acknowledge', 'q-main', [ $tok{a2}, $tok{a5} ]),
	"false TokenLost: the lock expired; the event can be received again\nfalse TokenLost: the lock expired; the event can be received again",
	'the locks not renewed expired (76 s after their receive)');
is(op('acknowledge', 'q-main', [ $tok{a4} ]), 'true ', 'the renewed one is still held and acknowledged');
@got = receive('q-main', 10);
is(join(',', sort map { "$_->[2]:$_->[1]" } @got), 'a2:3,a5:2,e1:2', 'expired locks: received again, delivery_count + 1');
%tok = (%tok, map { $_->[2] => $_->[0] } @got);
is(metric('q-main', 'lock_expired_total'), '3', 'three lock expirations counted');
is(op('acknowledge', 'q-main', [ $tok{e1} ]), 'true ', 'e1 acknowledged on its second delivery');

# --- max_delivery_count (3): a2 was received 3 times; released, it is dead-lettered, not received
is(op('release', 'q-main', [ $tok{a2} ]), 'true ', 'a2 released after its third receive');
@got = receive('q-main', 10);
is(scalar(@got), 0, 'a2 is not received a fourth time');
is(sql("SELECT dead_letter_reason || ' ' || delivery_attempts FROM eventgrid.dead_letters WHERE event->>'id' = 'a2'"),
	'MaxDeliveryCountExceeded 3', 'a2 dead-lettered: MaxDeliveryCountExceeded after 3 deliveries');
is(sql("SELECT dead_letter_event->'deadLetterProperties'->>'deadletterreason' || ' / '"
		  . " || (dead_letter_event->'deadLetterProperties'->>'deliveryresult')"
		  . " FROM eventgrid.dead_letter_events WHERE id = (SELECT id FROM eventgrid.dead_letters WHERE event->>'id' = 'a2')"),
	'Maximum delivery count was exceeded. / Received', 'dead_letter_events says it as Event Grid does');

# --- reject: dead-lettered at once
is(op('reject', 'q-main', [ $tok{a5}, $tok{a5} ]), "true \nfalse TokenLost: the same lock token came earlier in this call",
	'reject a5');
is(sql("SELECT dead_letter_reason || ' ' || delivery_attempts FROM eventgrid.dead_letters WHERE event->>'id' = 'a5'"),
	'Rejected 2', 'a rejected event is dead-lettered with reason Rejected');

# --- receive(max_events 2) that dead-letters an expired lock in the same call: at most 2
# (c1's lock is made to have ended before c2..c6 became receivable, in the
# statement before the call, so that the upkeep worker's sweep cannot take
# it first: the call's first look finds c1, to dead-letter, and c2; it
# looks again for one more, not two)
$topic{'q-cap'} = 'capped';
sql("SELECT eventgrid.create_topic('capped', 'CloudEventSchemaV1_0', 'namespace')");
sql("SELECT eventgrid.create_event_subscription('capped', 'q-cap', delivery_mode => 'queue', deadletter => true,"
	  . " max_delivery_count => 1)");
publish('capped', map { "c$_" } 1 .. 6);
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'q-cap'", '6'),
	'q-cap has its six events');
@got = receive('q-cap', 1);
is(join(',', map { $_->[2] } @got), 'c1', 'c1 received once (max_delivery_count 1)');
is(sql("UPDATE eventgrid.queue_events q SET receivable_at = receivable_at - interval '1 hour' WHERE $queued_event->>'id' = 'c1';"
		  . " SELECT string_agg(event->>'id', ',') FROM eventgrid.receive('capped', 'q-cap', 2, 10)"),
	'c2,c3', 'its lock expired, receive(max_events 2) dead-letters c1 and returns two events, c2 and c3');
is(sql("SELECT string_agg(event->>'id' || ' ' || dead_letter_reason, ', ' ORDER BY event->>'id')"
		  . " FROM eventgrid.dead_letters WHERE subscription_name = 'q-cap'"),
	'c1 MaxDeliveryCountExceeded', 'c1 dead-lettered: MaxDeliveryCountExceeded');
sql("SELECT eventgrid.drop_topic('capped')");

# --- receive(max_events 2) with released events and never-received ones: exactly 2
# (a lock token of one queue subscription settles nothing of another of the same topic)
$topic{'q-rel'} = 'releasing';
$topic{'q-rel2'} = 'releasing';
sql("SELECT eventgrid.create_topic('releasing', 'CloudEventSchemaV1_0', 'namespace')");
sql("SELECT eventgrid.create_event_subscription('releasing', '$_', delivery_mode => 'queue')") for qw(q-rel q-rel2);
publish('releasing', map { "r$_" } 1 .. 6);
ok(wait_for_sql($node, "SELECT sum(receivable_events) FROM eventgrid.queue_metrics WHERE event_subscription IN ('q-rel', 'q-rel2')", '12'),
	'q-rel and q-rel2 have six events each');
@got = receive('q-rel', 2);
is(join(',', map { $_->[2] } @got), 'r1,r2', 'q-rel: r1 and r2 received');
my @other = receive('q-rel2', 1);
for my $o ('acknowledge', 'release', 'reject', 'renew_locks')
{
	like(op($o, 'q-rel2', [ $got[0][0] ]), qr/^false (TokenLost|InvalidLockToken)/, "a q-rel lock token does not $o in q-rel2");
}
like(op('acknowledge', 'q-rel', [ $other[0][0] ]), qr/^false/, 'nor a q-rel2 token in q-rel');
is(op('release', 'q-rel', [ map { $_->[0] } @got ]), "true \ntrue ", 'q-rel releases both');
# (the released ones come first unless a rotation of the event tables, every
# 2 s here, has just set the never-received ones aside as receivable rows of
# their own, older than the release: the order is not promised, the counts are)
@got = receive('q-rel', 2);
my @again = receive('q-rel', 3);
my %distinct = map { $_->[2] => 1 } @got, @again;
is(scalar(@got) . ' ' . scalar(@again) . ' ' . scalar(keys %distinct), '2 3 5',
	'receive(max_events 2) then returns exactly two, and receive(max_events 3) three others');
is(scalar(grep { /^r[1-6]$/ } keys %distinct), 5, 'all of them q-rel\'s events');
is(metric('q-rel2', 'locked_events'), '1', 'q-rel2 still holds its one lock, untouched by the other subscription\'s calls');
sql("SELECT eventgrid.drop_topic('releasing')");

# --- max delivery count and time to live with no consumer: the upkeep worker
sql("SELECT eventgrid.create_event_subscription('expiring', 'q-ttl', delivery_mode => 'queue', deadletter => true,"
	  . " event_time_to_live => 'PT1M', max_delivery_count => 1)");
publish('expiring', 't1', 't2');
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'q-ttl'", '2'),
	'q-ttl has its two events');
@got = receive('q-ttl', 1);
is($got[0][2], 't1', 't1 received once (max_delivery_count 1)');
advance_clock($node, 61);
ok(wait_for_sql($node, "SELECT string_agg(event->>'id' || ' ' || dead_letter_reason, ', ' ORDER BY event->>'id')"
		  . " FROM eventgrid.dead_letters d WHERE subscription_name = 'q-ttl'",
		't1 TimeToLiveExceeded, t2 TimeToLiveExceeded', 30),
	'61 s later, with no consumer, both are dead-lettered: TimeToLiveExceeded');
is(metric('q-ttl', 'receivable_events + locked_events + delayed_events'), '0', 'and leave the queue');

# --- dropped without dead-lettering; redelivered dead letters
sql("SELECT eventgrid.create_event_subscription('dropping', 'q-drop', delivery_mode => 'queue')");
publish('dropping', 'd1');
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'q-drop'", '1'),
	'q-drop has d1');
@got = receive('q-drop', 1);
op('reject', 'q-drop', [ $got[0][0] ]);
is(metric('q-drop', "dropped_total || ' ' || dead_lettered_total || ' ' || rejected_total"), '1 0 1',
	'rejected without dead-lettering: dropped and counted');
is(sql("SELECT eventgrid.redeliver_dead_letters('orders', 'q-main')"), '2', 'q-main\'s two dead letters redelivered');
@got = receive('q-main', 10);
is(join(',', sort map { "$_->[2]:$_->[1]" } @got), 'a2:1,a5:1', 'receivable again, delivery_count from 1');
op('acknowledge', 'q-main', [ map { $_->[0] } @got ]);

# --- pg_dump / pg_restore keeps the queue, locks included
publish('dropping', 'x1', 'x2', 'x3');
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'q-drop'", '3'),
	'q-drop has x1, x2, x3');
my @locked = receive('q-drop', 2);
# the locked events (the unlocked one may be read where it was published, or copied there by a rotation)
my $qstate = "SELECT string_agg($queued_event->>'id' || ':' || q.delivery_count || ':' || q.receivable_at, ' ' ORDER BY q.id)"
  . " FROM eventgrid.queue_events q WHERE q.lock_secret IS NOT NULL";
my $qbefore = sql($qstate);
like($qbefore, qr/^x1:1:\S+ \S+ x2:1:/, 'x1 and x2 locked');
my $dump = $node->basedir . '/pull.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], 'pg_dump -Fc');
# delivery paused during the restore, as the README asks: pg_restore commits each table on its own,
# and the new database's upkeep worker would empty an event table restored before what holds it
# (seen once: the restored locked events had nothing to read)
sql("ALTER SYSTEM SET eventgrid.delivery_paused = on; SELECT pg_reload_conf()");
sql('CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ], 'pg_restore into a new database');
is($node->safe_psql('restored', $qstate), $qbefore, 'the restored queue has the same locked events, delivery counts and lock ends');
is($node->safe_psql('restored', "SELECT string_agg(event->>'id' || ':' || delivery_count, ' ')"
		  . " FROM eventgrid.receive('dropping', 'q-drop', 10, 10)"), 'x3:1', 'the restored database receives the unlocked one');
is($node->safe_psql('restored', "SELECT succeeded FROM eventgrid.acknowledge('dropping', 'q-drop', ARRAY['$locked[0][0]'])"),
	't', 'and a lock taken before the dump settles there too');
sql('DROP DATABASE restored');
sql("ALTER SYSTEM SET eventgrid.delivery_paused = off; SELECT pg_reload_conf()");
op('acknowledge', 'q-drop', [ map { $_->[0] } @locked ]);
op('acknowledge', 'q-drop', [ map { $_->[0] } receive('q-drop', 10) ]);

# --- what the views say
is(metric('q-main', "received_total || ' ' || acknowledged_total || ' ' || released_total || ' ' || rejected_total"),
	'14 7 3 1', 'queue_metrics: received, acknowledged, released, rejected');
is(sql("SELECT pending || ' ' || received || ' ' || acknowledged || ' ' || delivered FROM eventgrid.delivery_statistics WHERE subscription = 'q-main'"),
	'0 14 7 7', 'delivery_statistics: nothing pending, the same counts, the acknowledged events counted as delivered');
is(sql("SELECT (SELECT delivery_success_total FROM eventgrid.event_subscription_metrics WHERE event_subscription = 'q-main')"
		  . " || ' ' || (SELECT value FROM eventgrid.metrics WHERE event_subscription = 'q-main' AND metric_name = 'DeliverySuccessCount')"),
	'7 7', 'and so do the exporter\'s delivery_success_total and Event Grid\'s DeliverySuccessCount');
is(sql("SELECT label || '=' || value FROM eventgrid.event_subscription_metric_labels WHERE event_subscription = 'q-main'"
		  . " AND metric = 'dead_lettered_total' ORDER BY label"),
	"MaxDeliveryCountExceeded=1\nRejected=1\nTimeToLiveExceeded=0", 'dead letters by reason, the queue reasons');

# --- privileges
sql("CREATE ROLE consumer LOGIN IN ROLE eventgrid_receiver; CREATE ROLE app LOGIN IN ROLE eventgrid_publisher;"
	  . " CREATE ROLE ops LOGIN IN ROLE eventgrid_admin");
publish('orders', 'p1');
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'q-main'", '1'),
	'p1 receivable');
my $row = $node->safe_psql('postgres', "SET ROLE consumer; SELECT lock_token FROM eventgrid.receive('orders', 'q-main', 1, 10)");
ok($row ne '', 'eventgrid_receiver receives');
is($node->safe_psql('postgres', "SET ROLE consumer; SELECT succeeded FROM eventgrid.acknowledge('orders', 'q-main', ARRAY['$row'])"),
	't', 'and acknowledges');
like(fails("SELECT count(*) FROM eventgrid.queue_events", 'consumer'), qr/42501/, 'but reads no table');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'q-mine', delivery_mode => 'queue')", 'consumer'),
	qr/42501/, 'and creates no subscription');
like(fails("SELECT * FROM eventgrid.receive('orders', 'q-main', 1, 10)", 'app'),
	qr/42501.*HINT:  An admin grants it for this subscription with: SELECT eventgrid.grant_receive\('orders', 'q-main', 'app'\); or for every queue with: GRANT eventgrid_receiver TO app;/s,
	'a publisher cannot receive; the hint names eventgrid_receiver, not eventgrid_admin');
like(fails("SELECT * FROM eventgrid.acknowledge('orders', 'q-main', ARRAY['x'])", 'app'), qr/42501/, 'nor acknowledge');
like(fails("SELECT lock_secret FROM eventgrid.queue_events", 'ops'), qr/42501/, 'an administrator never reads lock secrets');
is($node->safe_psql('postgres', "SET ROLE ops; SELECT count(*) FROM eventgrid.queue_events"), '0',
	'but reads the queue (delivery_statistics does)');

# --- twenty idle long polls: no CPU, no event table lock, the tables rotate
my @polls;
for my $i (1 .. 20)
{
	push @polls, IPC::Run::start([ 'psql', '-X', '-At', '-d', $node->connstr('postgres'), '-c',
		"SELECT count(*) FROM eventgrid.receive('orders', 'q-main', 1, 30)" ], '>', \my $o, '2>', \my $e);
}
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%eventgrid.receive(''orders'', ''q-main'', 1, 30)%'"
		  . " AND wait_event = 'Extension'", '20'), 'twenty receive() calls wait');
my @pids = split /\n/, sql("SELECT pid FROM pg_stat_activity WHERE query LIKE '%eventgrid.receive(''orders'', ''q-main'', 1, 30)%'"
	  . " AND pid <> pg_backend_pid()");
is(sql("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
		  . " WHERE l.pid IN (" . join(',', @pids) . ") AND c.relname ~ '^events(_[0-9])?\$'"),
	'0', 'the waiting calls hold no lock on an event table');
my $rotated = sql("SELECT coalesce(max(truncated_at), '-infinity') FROM eventgrid.event_table_rotations");
my $ticks = cpu_ticks(@pids);
publish('custom', map { "r$_" } 1 .. 3);    # rows for the rotation to empty (custom has no subscription)
sleep 8;
my $used = cpu_ticks(@pids) - $ticks;
# (each rotation, every 2 s here, may wake them for one look each: a few
# ticks, more on a busy machine; polling, even every 100 ms, would use hundreds)
ok($used <= 50, "twenty waiting calls used $used clock ticks of CPU in 8 s (at most 50)");
ok(sql("SELECT max(truncated_at) > '$rotated' FROM eventgrid.event_table_rotations") eq 't',
	'the event tables rotated (every 2 s) while they waited');
publish('orders', map { "w$_" } 1 .. 20);
my $woken = 0;
for my $p (@polls) { $p->finish; $woken++ }
is($woken, 20, 'twenty events published: every waiting call returned');
is(metric('q-main', 'locked_events'), '20', 'each took one');

# --- twenty waiting calls while another consumer's open transaction holds
# the receivable event: they sleep until that transaction ends (no polling)
publish('orders', 'h1');
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'q-main'", '1'),
	'h1 receivable');
my $holder = IPC::Run::start([ 'psql', '-X', '-At', '-d', $node->connstr('postgres') ], '<', \my $hin, '>', \my $hout, '2>', \my $herr);
$hin = "BEGIN;\nSELECT lock_token FROM eventgrid.receive('orders', 'q-main', 1, 10);\n";
$holder->pump until $hout =~ /:/ || !$holder->pumpable;
like($hout, qr/^\d+:[0-9a-f-]{36}$/m, 'a consumer received h1 in a transaction it keeps open');
@polls = ();
my @pout = ('') x 20;
for my $i (0 .. 19)
{
	push @polls, IPC::Run::start([ 'psql', '-X', '-At', '-d', $node->connstr('postgres'), '-c',
		"SELECT count(*) || ' ' || coalesce(min(lock_token), '-') FROM eventgrid.receive('orders', 'q-main', 1, 12)" ],
		'>', \$pout[$i], '2>', \my $e);
}
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%eventgrid.receive(''orders'', ''q-main'', 1, 12)%'"
		  . " AND wait_event = 'Extension'", '20'), 'twenty receive() calls wait behind it');
@pids = split /\n/, sql("SELECT pid FROM pg_stat_activity WHERE query LIKE '%eventgrid.receive(''orders'', ''q-main'', 1, 12)%'"
	  . " AND pid <> pg_backend_pid()");
$ticks = cpu_ticks(@pids);
sleep 4;
$used = cpu_ticks(@pids) - $ticks;
ok($used <= 50, "twenty calls waiting on an event another transaction holds used $used clock ticks of CPU in 4 s (at most 50)");
$hin .= "ROLLBACK;\n";
$holder->finish;
$_->finish for @polls;
my @took = grep { /^1 / } @pout;
is(scalar(@took) . ' ' . scalar(grep { /^0 -$/ } @pout), '1 19',
	'the rollback made h1 receivable again: one of the waiting calls took it, the others returned empty');
is(metric('q-main', 'locked_events'), '21', 'h1 locked by that call');
my ($h1_token) = $took[0] =~ /^1 (\S+)/;
is(op('acknowledge', 'q-main', [ $h1_token ]), 'true ', 'and acknowledged');

# --- the Azure SDK's CloudEvent model parses what receive() returns
advance_clock($node, 61);    # the twenty locks expire
my $events = sql("SELECT json_agg(event) FROM eventgrid.receive('orders', 'q-main', 100, 10)");
my $py = <<'PY';
import json, sys
from azure.core.messaging import CloudEvent
events = [CloudEvent.from_dict(e) for e in json.load(sys.stdin)]
print(len(events), sorted(e.id for e in events)[0], events[0].source, events[0].type, events[0].data["orderId"] is not None)
PY
my ($pyout, $pyerr) = ('', '');
IPC::Run::run([ 'python3', '-c', $py ], '<', \$events, '>', \$pyout, '2>', \$pyerr);
is($pyout, "20 w1 /shop Shop.OrderCreated True\n", 'azure.core.messaging.CloudEvent parses the twenty received events')
  or diag($pyerr);

# --- each of Event Grid's release delays
publish('dropping', 'r60', 'r600', 'r3600');
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'q-drop'", '3'),
	'q-drop has three more');
my %rtok = map { $_->[2] => $_->[0] } receive('q-drop', 3);
op('release', 'q-drop', [ $rtok{$_} ], ", " . substr($_, 1)) for qw(r60 r600 r3600);
is(sql("SELECT string_agg($queued_event->>'id' || '=' || round(extract(epoch FROM receivable_at - eventgrid._clock_now()) / 10) * 10,"
		  . " ' ' ORDER BY receivable_at) FROM eventgrid.queue_events q JOIN eventgrid.event_subscriptions s"
		  . " ON s.id = q.subscription_id WHERE s.name = 'q-drop'"),
	'r60=60 r600=600 r3600=3600', 'released with 60, 600 and 3600 s: receivable after each delay');
is(metric('q-drop', 'delayed_events'), '3', 'queue_metrics counts them as delayed');

# --- eight consumers drain 100,000 events, each acknowledged exactly once
sql("SELECT eventgrid.create_event_subscription('bulk', 'q-drain', delivery_mode => 'queue', receive_lock_duration => 300)");
sql("CREATE TABLE acked (event_id text, consumer int)");
for my $k (0 .. 9)
{
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'bulk', jsonb_build_object('specversion', '1.0', 'id', 'n' || g,"
		  . " 'source', '/shop', 'type', 'Shop.OrderCreated', 'data', jsonb_build_object('n', g))"
		  . " FROM generate_series($k * 10000 + 1, ($k + 1) * 10000) g");
}
my @consumers;
$t0 = time;
for my $c (1 .. 8)
{
	push @consumers, IPC::Run::start([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-c', <<"SQL" ], '>', \my $o, '2>', \my $e);
DO \$\$
DECLARE
    toks text[];
    ids text[];
BEGIN
    LOOP
        SELECT array_agg(r.lock_token), array_agg(r.event->>'id') INTO toks, ids
          FROM eventgrid.receive('bulk', 'q-drain', 100, 10) r;
        EXIT WHEN toks IS NULL;
        INSERT INTO acked (event_id, consumer)
        SELECT ids[a.ord], $c FROM eventgrid.acknowledge('bulk', 'q-drain', toks) WITH ORDINALITY AS a(t, ok, err, ord)
         WHERE a.ok;
        COMMIT;
    END LOOP;
END \$\$;
SQL
}
$_->finish for @consumers;
my $drain = time - $t0 - 10;    # each ended after a last empty 10 s wait
is(sql("SELECT count(*) || ' ' || count(DISTINCT event_id) FROM acked"), '100000 100000',
	'eight consumers acknowledged 100,000 events, each exactly once');
ok(sql("SELECT count(DISTINCT consumer) FROM acked") >= 6, 'the work was shared');
is(metric('q-drain', "received_total || ' ' || acknowledged_total || ' ' || (receivable_events + locked_events)"),
	'100000 100000 0', 'nothing received twice, nothing left');
diag(sprintf('eight consumers: 100,000 events received and acknowledged in %.1f s', $drain));

# --- at most 1000 lock tokens a call; renewals within an hour of the receive
is(sql("SELECT count(*) FROM eventgrid.acknowledge('orders', 'q-main', array_fill('x'::text, ARRAY[1000]))"), '1000',
	'1000 lock tokens are taken (each malformed one fails alone)');
like(fails("SELECT * FROM eventgrid.acknowledge('orders', 'q-main', array_fill('x'::text, ARRAY[1001]))"),
	qr/54000.*lock_tokens must hold at most 1000 lock tokens, got 1001/, '1001 are refused');
sql("SELECT eventgrid.create_event_subscription('bulk', 'q-long', delivery_mode => 'queue', receive_lock_duration => 300)");
publish('bulk', 'long-1');
$topic{'q-long'} = 'bulk';
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'q-long'", '1'),
	'q-long has its event');
my ($long) = receive('q-long', 1);
my $renewed = 0;
for (1 .. 12)
{
	advance_clock($node, 290);
	$renewed++ if op('renew_locks', 'q-long', [ $long->[0] ]) eq 'true ';
}
is($renewed, 12, 'a 300 s lock renewed every 290 s for 58 minutes');
advance_clock($node, 150);
is(op('renew_locks', 'q-long', [ $long->[0] ]),
	'false LockRenewalLimitExceeded: a lock can be renewed within 1 hour of its receive only',
	'60.5 minutes after its receive it is not renewed');
is(op('acknowledge', 'q-long', [ $long->[0] ]), 'true ', 'though still held, and acknowledged');

done_testing();
