# Ordered delivery per key (SPEC 12, "Order per key"; issue "Ordered
# delivery per key"): a receiver (test/ordered_receiver.py) records, per
# key, the order of the events it answered 200 and whether two requests of
# one key were ever in flight at once.
#   - 5,000 events over 100 keys from four sessions in interleaved
#     transactions (each key's sequence numbers taken under its row lock, so
#     commit order is their order), 10 % of first attempts failing, two
#     delivery workers, single-event and batched subscriptions; events
#     without the key go unordered;
#   - an event that always fails holds only its key, which goes on in order
#     once the event is dead-lettered; blocked_ordering_keys and
#     ordering_metrics show it meanwhile;
#   - the happy path: 3,000 events over 50 keys published while paused (one
#     batch bigger than a claim) are claimed from the position, nothing
#     written per event (the retries' sequence does not move), no worker
#     holding the subscription after; a backlog whose transactions
#     overlapped is cut where every event taken has a lower id than every
#     event left, and arrives in id order; a delivery worker killed mid-way
#     leaves each key in order by first arrival and its hold released;
#   - a published table's 2,000 UPDATEs on 20 rows from four sessions, ordered
#     by subject: each row's versions arrive one by one, in order;
#   - a paused ordered subscription keeps its events at its position, and
#     the events waiting in the worker behind an event in flight when it was
#     paused go back unsent;
#     update_event_subscription(ordering_key => '') releases the events that
#     wait behind a failing one;
#   - pg_dump / pg_restore keeps a blocked key's head and waiting events;
#   - a bad ordering_key is refused (22023).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

my $node = new_node('ordered', 'eventgrid.delivery_workers' => 2, 'eventgrid.event_table_rotation' => "'1h'",
	restart_after_crash => 'on');
sub sql { return $node->safe_psql('postgres', shift) }

my $url = start_python_server('ordered_receiver.py', undef)->{url};
sub report
{
	my $res = HTTP::Tiny->new->get("$url/report");
	return decode_json($res->{content});
}

# Polls until topic $t has nothing pending, moving the worker's clock 10 s
# ahead every second so that retries (10 s, 30 s, ...) come due; at most
# $secs seconds.  Returns whether it drained.
sub drain
{
	my ($t, $secs) = @_;
	my $until = time + $secs;
	while (time < $until)
	{
		return 1 if sql("SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics WHERE topic = '$t'") eq '0';
		advance_clock($node, 10);
		usleep(1_000_000);
	}
	diag(sql("SELECT subscription, pending, delivered, failed_attempts FROM eventgrid.delivery_statistics WHERE topic = '$t'"));
	return 0;
}

# Runs the SQL texts in concurrent psql sessions; returns whether all succeeded.
sub concurrently
{
	my @h;
	for my $q (@_)
	{
		push @h, IPC::Run::start([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-c', $q ],
			'>', \my $out, '2>', \my $err);
	}
	my $ok = 1;
	for my $h (@h) { $h->finish; $ok = 0 if $h->result != 0 }
	return $ok;
}

# how many attempts of subscription $sub got no HTTP answer (after which an
# event may arrive again)
sub unanswered
{
	my $sub = shift;
	return sql("SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = '$sub' AND http_status IS NULL");
}

# whether, for each key of $keys (key => how many), the receiver got the
# sequence numbers 1..n in order at path $path, subscription $sub's, each
# by its first arrival: an event may arrive again (at-least-once) only when
# an attempt of $sub got no HTTP answer, at most once per such attempt; such
# a repeat may come after later events of its key, since a receiver can
# still take a request the sender gave up on after the response timeout
# (seen in a loaded run: an attempt timed out, its retry and the next five
# events were answered, then the receiver took the abandoned request); the
# first difference is printed
sub in_order
{
	my ($path, $keys, $sub) = @_;
	my $got = report()->{$path}{keys} // {};
	my $again = 0;
	for my $k (sort keys %$keys)
	{
		my @seen = map { $_ // 'null' } @{ $got->{$k} // [] };
		my %first;
		my @once = grep { !$first{$_}++ } @seen;
		$again += @seen - @once;
		my $want = join(',', 1 .. $keys->{$k});
		my $have = join(',', @once);
		next if $have eq $want;
		diag("$path key $k: got " . join(',', @seen) . ", want $want");
		# the attempts of its events, for finding the cause in a CI log
		diag(sql("SELECT string_agg(format('%s seq %s id %s txid %s attempt %s %s %s', a.attempted_at, coalesce(e.event #>> '{data,seq}', e.event #>> '{data,new,v}'), e.id, e.txid,"
			  . " a.attempt, a.outcome, a.http_status), E'\\n' ORDER BY a.attempted_at, e.id)"
			  . " FROM eventgrid.events e JOIN eventgrid.delivery_attempts a ON e.id = ANY (a.event_ids)"
			  . " WHERE a.subscription = '$sub' AND '$k' IN (e.event #>> '{data,orderId}', e.event ->> 'subject')"));
		return 0;
	}
	return 1 if $again == 0;
	my $unanswered = unanswered($sub);
	diag("$path: $again events arrived again, after $unanswered attempts without an HTTP answer");
	return $again <= $unanswered;
}

# whether the receiver never had two requests of one key at $path in flight
# at once, but beside a request subscription $sub's sender gave up on after
# the response timeout (which the receiver may still be answering when the
# retry comes: one such overlap per unanswered attempt)
sub one_at_a_time
{
	my ($path, $sub) = @_;
	my $overlaps = report()->{$path}{overlaps};
	my $unanswered = unanswered($sub);
	diag("$path: $overlaps overlaps, $unanswered attempts without an HTTP answer") if $overlaps > 0;
	return $overlaps <= $unanswered;
}

# --- 5,000 events over 100 keys, four sessions, 10 % failures -----------------
sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_event_subscription('orders', 'single', "
	  . "'$url/single?key=data.orderId&seq=data.seq&fail=10&delay_ms=5', ordering_key => 'data.orderId')");
sql("SELECT eventgrid.create_event_subscription('orders', 'batched', "
	  . "'$url/batched?key=data.orderId&seq=data.seq&fail=10', ordering_key => 'data.orderId', max_events_per_batch => 20)");
is(sql("SELECT string_agg(name || ':' || ordering_key, ',' ORDER BY name) FROM eventgrid.event_subscriptions"),
	'batched:data.orderId,single:data.orderId', 'create_event_subscription() sets ordering_key');
sql("CREATE TABLE key_seq (k int PRIMARY KEY, n int NOT NULL DEFAULT 0)");
sql("INSERT INTO key_seq (k) SELECT generate_series(0, 99)");
# each transaction publishes 5 events of random keys (in key order, so that
# sessions do not deadlock), each numbered under its key's row lock
my $publisher = q{
DO $$
DECLARE
	ks int[];
	s int;
BEGIN
	FOR t IN 1 .. 250 LOOP
		SELECT array_agg(k ORDER BY k) INTO ks FROM (SELECT (random() * 99)::int AS k FROM generate_series(1, 5)) x;
		FOR j IN 1 .. 5 LOOP
			UPDATE key_seq SET n = n + 1 WHERE k = ks[j] RETURNING n INTO s;
			INSERT INTO eventgrid.events (topic, event)
			VALUES ('orders', jsonb_build_object('id', 'SESSION-' || t || '-' || j, 'subject', '/orders', 'eventType', 'Shop.Order',
			        'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('orderId', 'o' || ks[j], 'seq', s)));
		END LOOP;
		COMMIT;
	END LOOP;
END $$};
ok(concurrently(map { (my $q = $publisher) =~ s/SESSION/s$_/; $q } 1 .. 4), 'four sessions published');
# events without the key: delivered, unordered
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'orders', jsonb_build_object('id', 'n' || i, 'subject', '/orders', "
	  . "'eventType', 'Shop.Note', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('note', i)) FROM generate_series(1, 100) i");
is(sql("SELECT sum(n) FROM key_seq"), '5000', '5,000 keyed events');
ok(drain('orders', 300), 'both subscriptions drained');
my %keys = map { ("o$_->[0]" => $_->[1]) } map { [ split /\|/ ] } split /\n/, sql("SELECT k, n FROM key_seq WHERE n > 0");
my $rep = report();
for my $p ('/single', '/batched')
{
	ok(one_at_a_time($p, substr($p, 1)), "$p: never two requests of one key in flight (but beside an abandoned one)");
	ok($rep->{$p}{failed} > 0, "$p: first attempts failed ($rep->{$p}{failed})");
	ok(in_order($p, \%keys, substr($p, 1)), "$p: every key's events arrived in commit order, once each (or again only after an unanswered attempt)");
	# again only after an attempt without an HTTP answer (at least once: seen once under load)
	my $none = scalar(@{ $rep->{$p}{keys}{'(none)'} // [] });
	my $unanswered = unanswered(substr($p, 1));
	ok($none >= 100 && $none - 100 <= $unanswered,
		"$p: the 100 events without the key arrived ($none arrivals: again only after an unanswered attempt, of which there were $unanswered)");
}
ok($rep->{'/batched'}{max_events} > 1, "batches carried several keys (up to $rep->{'/batched'}{max_events} events)");
is(sql("SELECT string_agg(subscription || ':' || delivered, ',' ORDER BY subscription) FROM eventgrid.delivery_statistics WHERE topic = 'orders'"),
	'batched:5100,single:5100', 'delivery_statistics counts every delivery');
is(sql("SELECT count(*) FROM eventgrid.retries"), '0', 'nothing left waiting');

# --- the happy path: from the position, nothing written per event -----------
# 3,000 events over 50 keys in 30 transactions of one session, published
# while paused: one batch at resume, more than a claim takes, in order as
# (txid, id) reads it.  Two workers, one holds the subscription at a time.
sub retries_made { return sql("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM eventgrid.retries_id_seq") }
sql("SELECT eventgrid.create_topic('happy')");
sql("SELECT eventgrid.create_event_subscription('happy', 'happy-sub', '$url/happy?key=data.k&seq=data.seq&delay_ms=2', "
	  . "ordering_key => 'data.k')");
sql("SELECT eventgrid.pause_delivery('happy', 'happy-sub')");
for my $t (0 .. 29)
{
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'happy', jsonb_build_object('id', 'h' || n, 'subject', '/h', "
		  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('k', 'k' || n % 50, 'seq', n / 50 + 1)) "
		  . "FROM generate_series($t * 100, $t * 100 + 99) n");
}
my $made = retries_made();
sql("SELECT eventgrid.resume_delivery('happy', 'happy-sub')");
ok(drain('happy', 120), 'the 3,000 ordered events drained');
ok(in_order('/happy', { map { ("k$_" => 60) } 0 .. 49 }, 'happy-sub'), 'each of the 50 keys arrived in order, once each');
ok(one_at_a_time('/happy', 'happy-sub'), 'never two requests of one key in flight');
is(retries_made(), $made, 'nothing went through the retries: claimed from the position, one request per event');
is(sql("SELECT count(*) FROM eventgrid.subscription_positions WHERE lease_owner IS NOT NULL"), '0',
	'no worker holds the subscription once its deliveries are recorded');
is(sql("SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'happy-sub'"), '3000',
	'delivery_statistics counts the 3,000');

# --- a backlog with overlapping transactions, cut where it is in order ------
# In txid order: T_c (500 events), T_a (key /k's second event), T_x (600),
# T_b (/k's first), T_d (1,500).  T_a took its txid before T_x and T_b, and
# published after T_b committed: its event has the higher id.  A claim of
# 1,000 rows would end inside T_x, with T_a's event taken and T_b's left;
# the claims cut after T_c (every event taken below every event left),
# then after T_b or later, sort what they take by id, and nothing goes
# through the retries.  (Checked to fail with claims that take what they
# read: /k arrives 2,1.)
sql("SELECT eventgrid.create_event_subscription('happy', 'cut-sub', '$url/cut?key=data.k&seq=data.seq', "
	  . "ordering_key => 'data.k')");
sql("SELECT eventgrid.pause_delivery('happy', 'cut-sub')");
sql("SELECT eventgrid.pause_delivery('happy', 'happy-sub')");
sub happy_event
{
	my ($id, $k, $seq) = @_;
	return "INSERT INTO eventgrid.events (topic, event) VALUES ('happy', jsonb_build_object('id', '$id', 'subject', '/h', "
	  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('k', '$k', 'seq', $seq)))";
}
sub happy_events
{
	my ($from, $to) = @_;
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'happy', jsonb_build_object('id', 'x' || n, 'subject', '/h', "
		  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('k', 'k' || n % 30, 'seq', n / 30 + 1)) "
		  . "FROM generate_series($from, $to) n");
}
happy_events(0, 499);
my ($in, $out) = ('', '');
my $t_a = IPC::Run::start([ 'psql', '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres') ],
	'<', \$in, '>', \$out, '2>', \my $err);
$in .= "BEGIN;\nSELECT pg_current_xact_id();\n";
$t_a->pump until $out =~ /\d/;
happy_events(500, 1099);
sql(happy_event('kb', '/k', 1));
$in .= happy_event('ka', '/k', 2) . ";\nCOMMIT;\n";
$t_a->finish;
ok($t_a->result == 0, 'T_a (lower txid) published after T_b (higher txid) committed');
happy_events(1100, 2599);
$made = retries_made();
sql("SELECT eventgrid.resume_delivery('happy', 'cut-sub')");
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'cut-sub'", '2602'),
	'the 2,602 events were delivered');
ok(in_order('/cut', { '/k' => 2, map { ("k$_" => 86 + ($_ < 20 ? 1 : 0)) } 0 .. 29 }, 'cut-sub'),
	'/k arrived in publish order (id order: T_b\'s first), and every other key in order');
is(retries_made(), $made, 'the batch was cut where it was in order: nothing went through the retries');
sql("SELECT eventgrid.resume_delivery('happy', 'happy-sub')");
ok(drain('happy', 60), 'happy-sub got the same events');

# --- a delivery worker killed mid-way: order by first arrival, nothing lost --
sql("SELECT eventgrid.create_event_subscription('happy', 'crash-sub', '$url/crash?key=data.k&seq=data.seq&delay_ms=20', "
	  . "ordering_key => 'data.k')");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'happy', jsonb_build_object('id', 'c' || n, 'subject', '/c', "
	  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('k', 'k' || n % 20, 'seq', n / 20 + 1)) "
	  . "FROM generate_series(0, 1999) n");
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.subscription_positions p JOIN eventgrid.event_subscriptions s "
	  . "ON s.id = p.subscription_id WHERE s.name = 'crash-sub' AND p.lease_owner IS NOT NULL", 't'),
	'a worker holds the ordered subscription');
my $holder = sql("SELECT p.lease_owner FROM eventgrid.subscription_positions p JOIN eventgrid.event_subscriptions s "
	  . "ON s.id = p.subscription_id WHERE s.name = 'crash-sub'");
usleep(300_000);
kill 'KILL', $holder;
usleep(1_000_000);
ok(wait_for_sql($node, 'SELECT 1', '1'), 'the server restarted after the crash');
ok(drain('happy', 180), 'after the crash and restart the rest drained');
ok(in_order('/crash', { map { ("k$_" => 100) } 0 .. 19 }, 'crash-sub'),
	'each key arrived in order by first arrival (again only after an unanswered attempt)');
ok(one_at_a_time('/crash', 'crash-sub'), 'never two requests of one key in flight but beside an abandoned one');
is(sql("SELECT count(*) FROM eventgrid.subscription_positions WHERE lease_owner IS NOT NULL"), '0',
	'the killed worker\'s hold was released');

# --- an event that always fails holds only its key ----------------------------
sql("SELECT eventgrid.create_topic('stuck')");
sql("SELECT eventgrid.create_event_subscription('stuck', 'stk', '$url/stuck?key=subject&seq=data.seq', "
	  . "ordering_key => 'subject', max_delivery_attempts => 2, deadletter => true)");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'stuck', jsonb_build_object('id', k || i, 'subject', k, 'eventType', 'T', "
	  . "'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('seq', i, 'fail', k = '/a' AND i = 2)) "
	  . "FROM unnest(ARRAY['/a', '/b']) k, generate_series(1, 5) i ORDER BY i, k");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.blocked_ordering_keys WHERE subscription = 'stk'", '1'),
	'the failing event blocks its key');
for (1 .. 300)
{
	last if scalar(@{ report()->{'/stuck'}{keys}{'/b'} // [] }) >= 5;
	usleep(100_000);
}
ok(in_order('/stuck', { '/b' => 5 }, 'stk'), 'the other key arrived in order meanwhile');
is(join(',', @{ report()->{'/stuck'}{keys}{'/a'} }), '1', 'key /a: only the event before the failing one arrived');
is(sql("SELECT ordering_key || ' ' || attempts || ' ' || last_http_status || ' ' || waiting FROM eventgrid.blocked_ordering_keys"),
	'/a 1 500 3', 'blocked_ordering_keys: the key, its failing event\'s attempts and status, 3 events waiting');
is(sql("SELECT blocked_keys || ' ' || waiting_events FROM eventgrid.ordering_metrics WHERE subscription = 'stk'"),
	'1 3', 'ordering_metrics: one blocked key, 3 events waiting');
ok(drain('stuck', 60), 'the failing event is dead-lettered after its second attempt');
ok(in_order('/stuck', { '/b' => 5 }, 'stk'), 'key /b unchanged');
is(join(',', @{ report()->{'/stuck'}{keys}{'/a'} }), '1,3,4,5', 'key /a went on in order after the dead letter');
is(sql("SELECT event->'data'->>'seq' || ' ' || dead_letter_reason FROM eventgrid.dead_letters"),
	'2 MaxDeliveryAttemptsExceeded', 'the failing event was dead-lettered');
ok(one_at_a_time('/stuck', 'stk'), 'never two requests of one key in flight');

# --- table changes ordered by subject ----------------------------------------
sql("CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)");
sql("INSERT INTO items (id) SELECT generate_series(1, 20)");
sql("SELECT eventgrid.create_topic('rows')");
sql("SELECT eventgrid.publish_table_changes('items', 'rows', ARRAY['UPDATE'])");
sql("SELECT eventgrid.create_event_subscription('rows', 'row-order', '$url/rows?key=subject&seq=data.new.v&fail=10&delay_ms=5', "
	  . "ordering_key => 'subject')");
my $updater = q{
DO $$
BEGIN
	FOR t IN 1 .. 500 LOOP
		UPDATE items SET v = v + 1 WHERE id = (SELECT 1 + (random() * 19)::int);
		COMMIT;
	END LOOP;
END $$};
ok(concurrently(($updater) x 4), 'four sessions made 2,000 UPDATEs');
is(sql("SELECT sum(v) FROM items"), '2000', '2,000 row versions');
ok(drain('rows', 300), 'the row changes drained');
my %rows = map { ("/public/items/$_->[0]" => $_->[1]) } map { [ split /\|/ ] } split /\n/, sql("SELECT id, v FROM items WHERE v > 0");
ok(one_at_a_time('/rows', 'row-order'), 'never two changes of one row in flight');
ok(in_order('/rows', \%rows, 'row-order'), "each row's versions arrived one by one, in commit order");

# --- paused; then unordered: what waited for its key goes at once -----------
sql("SELECT eventgrid.create_topic('held')");
sql("SELECT eventgrid.create_event_subscription('held', 'hold', '$url/held?key=subject&seq=data.seq', ordering_key => 'subject')");
sql("SELECT eventgrid.pause_delivery('held', 'hold')");
# the key's first event fails every time
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'held', jsonb_build_object('id', 'h' || i, 'subject', '/k', 'eventType', 'T', "
	  . "'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('seq', i, 'fail', i = 1)) FROM generate_series(1, 3) i");
sleep 1;
is(sql("SELECT pending || ' ' || retrying FROM eventgrid.delivery_statistics WHERE subscription = 'hold'"), '3 0',
	'paused: the events wait at the position');
sql("SELECT eventgrid.resume_delivery('held', 'hold')");
ok(wait_for_sql($node, "SELECT count(*) FILTER (WHERE r.next_attempt_at < 'infinity' AND r.attempts = 1) || ' ' "
	  . "|| count(*) FILTER (WHERE r.next_attempt_at = 'infinity') "
	  . "FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id WHERE s.name = 'hold'", '1 2'),
	'resumed: the key\'s first event failed, the later two wait for it');
sql("SELECT eventgrid.update_event_subscription('held', 'hold', ordering_key => '')");
is(sql("SELECT coalesce(ordering_key, 'unordered') FROM eventgrid.event_subscriptions WHERE name = 'hold'"), 'unordered',
	"ordering_key => '' makes the subscription unordered");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id "
	  . "WHERE s.name = 'hold'", '1'), 'the two that waited are delivered at once, the failing one is still retried');
is(join(',', sort @{ report()->{'/held'}{keys}{'/k'} // [] }), '2,3', 'they arrived');

# --- paused while a key's later events wait in the worker for its first -----
# the receiver answers each request after 1.5 s: the key's first event is in
# flight, the other four wait behind it in the worker when the subscription
# is paused; they must not be sent once the first is answered
sql("SELECT eventgrid.create_topic('slow')");
sql("SELECT eventgrid.create_event_subscription('slow', 'slow-sub', '$url/slow?key=subject&seq=data.seq&delay_ms=1500', "
	  . "ordering_key => 'subject')");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'slow', jsonb_build_object('id', 's' || i, 'subject', '/k', 'eventType', 'T', "
	  . "'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('seq', i)) FROM generate_series(1, 5) i");
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.chunks_in_flight c JOIN eventgrid.event_subscriptions s "
	  . "ON s.id = c.subscription_id WHERE s.name = 'slow-sub'", 't'), 'the five events are claimed');
sql("SELECT eventgrid.pause_delivery('slow', 'slow-sub')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id "
	  . "WHERE s.name = 'slow-sub'", '4'), 'paused: the four that waited in the worker went back, unsent, into the retries');
usleep(2_000_000);
is(join(',', @{ report()->{'/slow'}{keys}{'/k'} // [] }), '1', 'only the event in flight at the pause arrived');
sql("SELECT eventgrid.resume_delivery('slow', 'slow-sub')");
ok(drain('slow', 60), 'resumed: the rest drained');
is(join(',', @{ report()->{'/slow'}{keys}{'/k'} // [] }), '1,2,3,4,5', 'in order');

# --- pg_dump / pg_restore keeps a blocked key as it was ---------------------
sql("SELECT eventgrid.create_topic('kept')");
sql("SELECT eventgrid.create_event_subscription('kept', 'kept-sub', '$url/kept?key=subject&seq=data.seq', ordering_key => 'subject')");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'kept', jsonb_build_object('id', 'k' || i, 'subject', '/k', 'eventType', 'T', "
	  . "'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('seq', i, 'fail', i = 1)) FROM generate_series(1, 3) i");
ok(wait_for_sql($node, "SELECT waiting FROM eventgrid.blocked_ordering_keys WHERE subscription = 'kept-sub'", '2'),
	'a key blocked by its failing first event, two events behind it');
sql("SELECT eventgrid.pause_delivery('kept', 'kept-sub')");
my $state = q{SELECT string_agg(r.event->'data'->>'seq' || ':' || r.ordering_key || ':' || (r.next_attempt_at = 'infinity')
	|| ':' || (k.head_id IS NOT NULL), ' ' ORDER BY r.id)
  FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id
  LEFT JOIN eventgrid.ordering_keys k ON k.head_id = r.id WHERE s.name = 'kept-sub'};
my $before = sql($state);
is($before, '1:/k:false:true 2:/k:true:false 3:/k:true:false', 'the head is due and named in ordering_keys, the others wait');
my $dump = $node->basedir . '/ordered.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], 'pg_dump -Fc');
sql('CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ], 'pg_restore into a new database');
is($node->safe_psql('restored', $state), $before, 'the restored database has the same heads and waiting events');

# --- a bad ordering_key -------------------------------------------------------
like(sql_error($node, "SELECT eventgrid.create_event_subscription('held', 'bad', '$url/x', ordering_key => 'data..x')"),
	qr/22023.*invalid ordering_key "data\.\.x".*HINT:.*dotted field path/s, 'an ordering_key that is not a field path: 22023');
like(sql_error($node, "SELECT eventgrid.update_event_subscription('orders', 'single', ordering_key => repeat('a', 600))"),
	qr/22023/, 'a path over 512 characters: 22023');

$node->stop;
done_testing();
