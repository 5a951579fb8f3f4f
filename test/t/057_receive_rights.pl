# Receive rights per queue subscription, and waiting consumers that cost
# nothing and hold nothing (issue "Trust, fourth pass", items 2, 4 and 5):
#  - grant_receive(topic, subscription, role) lets a role that is not a
#    member of eventgrid_receiver call the five pull functions on that
#    subscription only (42501 elsewhere, whether or not the subscription
#    exists), a topic-wide grant (subscription NULL) reaches the topic's
#    queue subscriptions present and future, members of a granted role
#    inherit it; revoke_receive() takes it back, also from a consumer
#    already waiting; only eventgrid_admin grants; the grants are shown in
#    event_subscription_receivers, logged once, dumped and restored;
#  - a grant follows the role, not its name (issue "Trust, fifth pass",
#    item 6): renamed, the role keeps it; a new role given the old name
#    gets nothing; dropped, its grants vanish; a restore binds a grant to
#    the role of its name there (a role dropped and made again between the
#    dump and the restore gets it back, as pg_dump does for privileges);
#    a grant on topic A's subscription is not honoured for topic B's
#    subscription of the same name;
#  - twenty consumers waiting on one subscription's empty queue use no CPU
#    while another subscription of the database gets 200 events a second
#    (each commit wakes only its own subscription's waiters);
#  - a waiting receive() holds no lock: drop_event_subscription() and DROP
#    EXTENSION run at once (lock_timeout 5 s), and the waiting consumer gets
#    a clear error (42704, 55000) as soon as they commit, also when it
#    wakes before the DROP's catalog invalidations are sent (gdb holds the
#    dropping backend there).
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

my $node = new_node('rights', 'eventgrid.event_table_rotation' => "'2s'");
my $json = JSON::PP->new->canonical;

sub sql { return $node->safe_psql('postgres', shift) }
sub fails { return sql_error($node, @_) }
sub as { my ($role, $q) = @_; return $node->safe_psql('postgres', "SET ROLE $role; $q") }

sub publish
{
	my ($topic, @ids) = @_;
	my $events = join(',', map {
		$json->encode({ specversion => '1.0', id => $_, source => '/shop', type => 'Shop.OrderCreated', data => {} }) } @ids);
	sql("SELECT eventgrid.publish('$topic', '[$events]')");
}

sub count_log { my $re = shift; my @m = slurp_file($node->logfile) =~ /$re/g; return scalar @m }

# a long poll in its own psql: (handle, \stdout, \stderr)
sub wait_in_psql
{
	my ($role, $topic, $sub, $secs) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ 'psql', '-X', '-At', '-v', 'VERBOSITY=verbose', '-d', $node->connstr('postgres'), '-c',
		($role ? "SET ROLE $role; " : '') . "SELECT count(*) FROM eventgrid.receive('$topic', '$sub', 1, $secs)" ],
		'>', \$out, '2>', \$err);
	return ($h, \$out, \$err);
}

sub waiting_pids
{
	my ($topic, $sub, $n) = @_;
	my $q = "SELECT pid FROM pg_stat_activity WHERE query LIKE '%eventgrid.receive(''$topic'', ''$sub''%'"
	  . " AND wait_event = 'Extension' AND pid <> pg_backend_pid()";
	wait_for_sql($node, "SELECT count(*) FROM ($q) w", $n) or return ();
	return split /\n/, sql($q);
}

sql("CREATE ROLE consumer_a LOGIN; CREATE ROLE team NOLOGIN; CREATE ROLE member_b LOGIN IN ROLE team;"
	  . " CREATE ROLE ops LOGIN IN ROLE eventgrid_admin; CREATE ROLE app LOGIN IN ROLE eventgrid_publisher");
sql("SELECT eventgrid.create_topic('$_', 'CloudEventSchemaV1_0', 'namespace')") for qw(orders billing);
sql("SELECT eventgrid.create_event_subscription('orders', '$_', delivery_mode => 'queue')") for qw(qq1 qq2);
sql("SELECT eventgrid.create_event_subscription('billing', 'bb1', delivery_mode => 'queue')");
sql("SELECT eventgrid.create_event_subscription('orders', 'pp1', 'http://127.0.0.1:1/x'); SELECT eventgrid.pause_delivery('orders', 'pp1')");

# --- no right: 42501 whether or not the subscription exists
my $err = fails("SELECT * FROM eventgrid.receive('orders', 'qq1', 1, 10)", 'consumer_a');
like($err, qr/42501: permission denied to receive from event subscription "qq1" of topic "orders"/,
	'a role without a grant cannot receive');
like($err, qr/HINT:  An admin grants it for this subscription with: SELECT eventgrid.grant_receive\('orders', 'qq1', 'consumer_a'\); or for every queue with: GRANT eventgrid_receiver TO consumer_a;/,
	'the hint names grant_receive() with these names, and eventgrid_receiver');
unlike($err, qr/CONTEXT:/, 'and no internal CONTEXT');
like(fails("SELECT * FROM eventgrid.receive('orders', 'nosuch', 1, 10)", 'consumer_a'), qr/42501/,
	'nor learns whether a subscription exists');
sql("CREATE ROLE recv LOGIN IN ROLE eventgrid_receiver");
$err = fails("SELECT * FROM eventgrid.receive('orders', 'nosuch', 1, 10)", 'recv');
like($err, qr/42704: event subscription "nosuch" of topic "orders" does not exist.*HINT:  Check the topic and subscription names/s,
	'a member of eventgrid_receiver asking for an unknown subscription: 42704, with a hint that names no table it cannot read');
unlike($err, qr/CONTEXT:|event_subscriptions;/, 'and no internal CONTEXT');
like(fails("SELECT eventgrid.grant_receive('orders', 'qq1', 'consumer_a')", 'app'), qr/42501/, 'only eventgrid_admin grants');
like(fails("SELECT * FROM eventgrid.event_subscription_receivers", 'app'), qr/42501/, 'or lists the grants');

# --- a grant for one subscription
as('ops', "SELECT eventgrid.grant_receive('orders', 'qq1', 'consumer_a')");
as('ops', "SELECT eventgrid.grant_receive('orders', 'qq1', 'consumer_a')");
is(count_log(qr/eventgrid: role "consumer_a" may receive from queue event subscription "qq1" of topic "orders", granted by ops/), 1,
	'granted once (granting again does nothing), logged once');
publish('orders', 'e1');
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'qq1'", '1'), 'e1 receivable');
my $tok = as('consumer_a', "SELECT lock_token FROM eventgrid.receive('orders', 'qq1', 1, 10)");
like($tok, qr/^\d+:/, 'the grantee receives from qq1');
is(as('consumer_a', "SELECT succeeded FROM eventgrid.renew_locks('orders', 'qq1', ARRAY['$tok'])"), 't', 'renews its lock');
is(as('consumer_a', "SELECT succeeded FROM eventgrid.acknowledge('orders', 'qq1', ARRAY['$tok'])"), 't', 'and acknowledges');
like(fails("SELECT * FROM eventgrid.receive('orders', 'qq2', 1, 10)", 'consumer_a'), qr/42501.*"qq2"/s, 'but not from qq2');
for my $op ('acknowledge', 'reject', 'renew_locks', 'release')
{
	like(fails("SELECT * FROM eventgrid.$op('orders', 'qq2', ARRAY['1:x'])", 'consumer_a'), qr/42501/, "nor $op() there");
}
like(fails("SELECT * FROM eventgrid.receive('billing', 'bb1', 1, 10)", 'consumer_a'), qr/42501/, 'nor from another topic');
like(fails("SELECT count(*) FROM eventgrid.queue_events", 'consumer_a'), qr/42501/, 'and reads no table');

# --- a topic-wide grant to a role: its members reach every queue of the topic, present and future
as('ops', "SELECT eventgrid.grant_receive('orders', NULL, 'team')");
sql("SELECT eventgrid.create_event_subscription('orders', 'qq3', delivery_mode => 'queue')");
publish('orders', 'e2');
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'qq3'", '1'),
	'e2 receivable in qq3 (and in qq2 beside e1)');
is(as('member_b', "SELECT count(*) FROM eventgrid.receive('orders', 'qq2', 1, 10)") . ' '
	  . as('member_b', "SELECT count(*) FROM eventgrid.receive('orders', 'qq3', 1, 10)"), '1 1',
	'a member of the granted role receives from qq2 and from qq3, made after the grant');
like(fails("SELECT * FROM eventgrid.receive('billing', 'bb1', 1, 10)", 'member_b'), qr/42501/, 'not from another topic');
is(as('ops', "SELECT string_agg(topic || '/' || coalesce(subscription, '*') || ' ' || role_name || ' ' || role_exists"
		  . " || ' ' || granted_by, ', ') FROM eventgrid.event_subscription_receivers"),
	'orders/* team true ops, orders/qq1 consumer_a true ops', 'event_subscription_receivers shows both grants to admins');

# --- bad input
like(fails("SELECT eventgrid.grant_receive('orders', 'qq1', 'nobody')", 'ops'), qr/42704.*role "nobody" does not exist/, 'an unknown role: 42704');
like(fails("SELECT eventgrid.grant_receive('nope', 'qq1', 'consumer_a')", 'ops'), qr/42704.*topic "nope" does not exist/, 'an unknown topic');
like(fails("SELECT eventgrid.grant_receive('orders', 'zz', 'consumer_a')", 'ops'), qr/42704/, 'an unknown subscription');
like(fails("SELECT eventgrid.grant_receive('orders', 'pp1', 'consumer_a')", 'ops'), qr/42809/, 'a push subscription: 42809');
like(fails("SELECT eventgrid.grant_receive('orders', 'qq1', NULL)", 'ops'), qr/22004/, 'a NULL role: 22004');

# --- dumped and restored
my $dump = $node->basedir . '/rights.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], 'pg_dump');
sql('CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored'), $dump ], 'pg_restore');
is($node->safe_psql('restored', "SELECT string_agg(topic || '/' || coalesce(subscription, '*') || ' ' || role_name, ', ')"
		  . " FROM eventgrid.event_subscription_receivers"),
	'orders/* team, orders/qq1 consumer_a', 'the grants survive pg_dump and pg_restore');
sql('DROP DATABASE restored');

# --- a grant follows the role, not its name
sql("SELECT eventgrid.create_event_subscription('billing', 'qq1', delivery_mode => 'queue')");
like(fails("SELECT * FROM eventgrid.receive('billing', 'qq1', 1, 10)", 'consumer_a'), qr/42501/,
	"a grant on orders' qq1 is not honoured for billing's qq1");
sql("CREATE ROLE mover LOGIN");
as('ops', "SELECT eventgrid.grant_receive('orders', 'qq1', 'mover')");
sql("ALTER ROLE mover RENAME TO moved");
like(as('moved', "SELECT count(*) FROM eventgrid.receive('orders', 'qq1', 1, 10)"), qr/^[01]$/, 'renamed, the role still receives');
is(as('ops', "SELECT role_name || ' ' || role_exists FROM eventgrid.event_subscription_receivers WHERE role_name IN ('mover', 'moved')"),
	'moved true', 'shown by its new name');
sql("CREATE ROLE mover LOGIN");
like(fails("SELECT * FROM eventgrid.receive('orders', 'qq1', 1, 10)", 'mover'), qr/42501/, 'a new role given the old name gets nothing');
ok(wait_for_sql($node, "SELECT role_name FROM eventgrid.receive_grants WHERE role_oid = 'moved'::regrole", 'moved'),
	'the upkeep worker writes the new name into the grant (what a dump carries)');
my $dump2 = $node->basedir . '/rights2.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump2, '-d', $node->connstr('postgres') ], 'pg_dump after the rename');
sql("DROP ROLE moved");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.event_subscription_receivers WHERE role_name IN ('mover', 'moved')", '0'),
	'dropped, the role\'s grants vanish');
like(fails("SELECT * FROM eventgrid.receive('orders', 'qq1', 1, 10)", 'mover'), qr/42501/, 'and nobody gets them');
sql("CREATE ROLE moved LOGIN");
like(fails("SELECT * FROM eventgrid.receive('orders', 'qq1', 1, 10)", 'moved'), qr/42501/, 'not even a new role of the dropped one\'s name');
sql('CREATE DATABASE restored2');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored2'), $dump2 ], 'pg_restore');
like($node->safe_psql('restored2', "SET ROLE moved; SELECT count(*) FROM eventgrid.receive('orders', 'qq1', 1, 10)"), qr/^[01]$/,
	'a restore binds the grant to the role of its name there, as pg_dump binds privileges');
is($node->safe_psql('restored2', "SELECT role_oid = 'moved'::regrole FROM eventgrid.receive_grants WHERE role_name = 'moved'"), 't',
	'by that role\'s OID');
sql('DROP DATABASE restored2');

# --- revoked: at once, also for a consumer already waiting
as('ops', "SELECT eventgrid.revoke_receive('orders', NULL, 'team')");
like(fails("SELECT * FROM eventgrid.receive('orders', 'qq2', 1, 10)", 'member_b'), qr/42501/, 'revoked: 42501 again');
my ($ret, $o, $notice) = $node->psql('postgres', "SET ROLE ops; SELECT eventgrid.revoke_receive('orders', NULL, 'team')");
like($notice, qr/NOTICE:  role "team" had no receive right on every queue event subscription of topic "orders": nothing revoked/,
	'revoking what is not granted: a NOTICE');
sql("SELECT eventgrid.create_topic('quiet', 'CloudEventSchemaV1_0', 'namespace');"
	  . " SELECT eventgrid.create_event_subscription('quiet', 'qr1', delivery_mode => 'queue')");
as('ops', "SELECT eventgrid.grant_receive('quiet', 'qr1', 'consumer_a')");
my ($w, $wout, $werr) = wait_in_psql('consumer_a', 'quiet', 'qr1', 30);
my @w = waiting_pids('quiet', 'qr1', 1);
is(scalar(@w), 1, 'the grantee waits on an empty queue');
as('ops', "SELECT eventgrid.revoke_receive('quiet', 'qr1', 'consumer_a')");
publish('quiet', 'e3');
$w->finish;
like($$werr, qr/42501: permission denied to receive from event subscription "qr1"/,
	'revoked while it waited: the event woke it, and it got 42501, not the event');

# --- twenty waiters on billing/bb1 while orders/qq1 gets 200 events a second
my @polls = map { [ wait_in_psql(undef, 'billing', 'bb1', 30) ] } 1 .. 20;
my @pids = waiting_pids('billing', 'bb1', 20);
is(scalar(@pids), 20, 'twenty consumers wait on bb1');
my $moved = sql("SELECT coalesce(sum(receivable_events), 0) FROM eventgrid.queue_metrics WHERE event_subscription = 'qq1'");
my $ticks = cpu_ticks(@pids);
my $t0 = time();
sql("DO \$\$ BEGIN FOR i IN 1 .. 1000 LOOP"
	  . " PERFORM eventgrid.publish('orders', jsonb_build_object('specversion', '1.0', 'id', 'busy-' || i, 'source', '/shop',"
	  . " 'type', 'Shop.OrderCreated')); COMMIT; PERFORM pg_sleep(0.005); END LOOP; END \$\$");
ok(wait_for_sql($node, "SELECT sum(receivable_events) >= $moved + 1000 FROM eventgrid.queue_metrics WHERE event_subscription = 'qq1'", 't'),
	'1,000 events published one per commit reached qq1');
my $secs = time() - $t0;
my $used = cpu_ticks(@pids) - $ticks;
ok($used <= 5, sprintf('twenty consumers waiting on bb1 used %d clock ticks of CPU while qq1 got %.0f events a second for %.1f s (at most 5)',
	$used, 1000 / $secs, $secs));
publish('billing', map { "b$_" } 1 .. 20);
$_->[0]->finish for @polls;
is(join('', map { ${ $_->[1] } =~ s/\s+//gr } @polls), '1' x 20, 'twenty events for bb1: every waiting consumer returned with one');

# --- a waiting consumer holds no lock: its subscription or the extension can go
sql("SELECT eventgrid.create_event_subscription('quiet', '$_', delivery_mode => 'queue')") for qw(qd1 qd2);
($w, $wout, $werr) = wait_in_psql(undef, 'quiet', 'qd1', 60);
@w = waiting_pids('quiet', 'qd1', 1);
is(sql("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
		  . " WHERE l.pid = $w[0] AND c.relnamespace = 'eventgrid'::regnamespace"), '0',
	'a waiting receive() holds no lock on any eventgrid relation');
$t0 = time();
sql("SET lock_timeout = '5s'; SELECT eventgrid.drop_event_subscription('quiet', 'qd1')");
$w->finish;
like($$werr, qr/42704: event subscription "qd1" of topic "quiet" was dropped while eventgrid.receive\(\) waited/,
	sprintf('drop_event_subscription() ran at once; the waiting consumer was told (%.1f s)', time() - $t0));
($w, $wout, $werr) = wait_in_psql(undef, 'quiet', 'qd2', 60);
@w = waiting_pids('quiet', 'qd2', 1);
$t0 = time();
my ($dret, $dout, $derr) = $node->psql('postgres', "SET lock_timeout = '5s'; DROP EXTENSION eventgrid");
is($dret . $derr, '0', 'DROP EXTENSION ran at once beside a waiting receive()');
$w->finish;
like($$werr, qr/55000: extension eventgrid was dropped while eventgrid.receive\(\) waited/,
	sprintf('the waiting consumer was told at once (%.1f s)', time() - $t0));

# --- the commit of DROP EXTENSION wakes a waiting consumer before it sends
# its catalog invalidations.  gdb holds the dropping backend right there
# (in eventgrid's commit callback, after the wake); the consumer processes
# another session's invalidation of event_subscriptions (ANALYZE) but
# still has the extension in its catalog cache (PostgreSQL 18 caches
# extensions by name): it must say 55000 all the same, at once
sql("CREATE EXTENSION eventgrid; SELECT eventgrid.create_topic('quiet', 'CloudEventSchemaV1_0', 'namespace');"
	  . " SELECT eventgrid.create_event_subscription('quiet', 'qd3', delivery_mode => 'queue')");
($w, $wout, $werr) = wait_in_psql(undef, 'quiet', 'qd3', 60);
@w = waiting_pids('quiet', 'qd3', 1);
my $go = "${PostgreSQL::Test::Utils::tmp_check}/057_dropper_go";
my ($drop_out, $drop_err) = ('', '');
my $dropper = IPC::Run::start([ 'psql', '-X', '-At', '-d', $node->connstr('postgres'),
	'-c', 'SELECT pg_sleep(3600) /* the dropper */', '-c', 'ANALYZE eventgrid.event_subscriptions', '-c', 'DROP EXTENSION eventgrid' ],
	'>', \$drop_out, '2>', \$drop_err);
wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(3600) /* the dropper */%'", '1');
my $dropper_pid = sql("SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(3600) /* the dropper */%'");
my ($gdb_out, $gdb_err) = ('', '');
my $gdb = IPC::Run::start([ 'gdb', '-p', $dropper_pid, '-batch', '-nx',
	'-ex', 'handle SIGUSR1 nostop noprint pass', '-ex', 'handle SIGUSR2 nostop noprint pass',
	'-ex', 'handle SIGINT nostop noprint pass', '-ex', 'break eg_db_extension_changed', '-ex', 'continue',
	'-ex', 'info symbol $pc', '-ex', "shell for i in \$(seq 600); do [ -e $go ] && break; sleep 0.1; done", '-ex', 'detach' ],
	'>', \$gdb_out, '2>', \$gdb_err);
for (1 .. 600)
{
	$gdb->pump_nb;
	last if $gdb_out =~ /Breakpoint 1 at/;
	usleep(100_000);
}
sql("SELECT pg_cancel_backend($dropper_pid)");	# ends the pg_sleep; ANALYZE and DROP EXTENSION follow
$t0 = time();
$w->finish;
my $waited = time() - $t0;
my $still_held = $gdb->pumpable ? 1 : 0;	# gdb lets go once told to (or after 60 s)
open(my $fh, '>', $go) or die "$go: $!";
close $fh;
$gdb->finish;
$dropper->finish;
ok($gdb_out =~ /^eg_db_extension_changed( \+ \d+)? in section/m, 'gdb held the commit of DROP EXTENSION after its wake')
	or diag("$gdb_out $gdb_err");
ok($still_held, 'the waiting consumer returned while DROP EXTENSION was held there');
like($$werr, qr/55000: extension eventgrid was dropped while eventgrid.receive\(\) waited/,
	sprintf('woken before the invalidations of DROP EXTENSION: 55000 (%.1f s)', $waited));
like($drop_out . $drop_err, qr/canceling statement due to user request/, 'the dropper ran ANALYZE and DROP EXTENSION after its pg_sleep');
is(sql("SELECT count(*) FROM pg_extension WHERE extname = 'eventgrid'"), '0', 'and the extension is gone');

done_testing();
