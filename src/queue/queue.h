/*
 * queue.h - what the pull delivery functions (queue_receive.c, settle in
 * queue_access.c) share: who may use a queue event subscription, and
 * running as the extension's owner.
 */
#ifndef EG_QUEUE_H
#define EG_QUEUE_H

#include "postgres.h"

/* The role that called, and the one the call runs as, between eg_queue_enter() and eg_queue_leave(). */
typedef struct EgQueueCaller
{
	Oid			caller;			/* GetUserId() at the call: whose rights count */
	Oid			saved_userid;
	int			saved_sec_context;
} EgQueueCaller;

/*
 * The pull functions are SECURITY INVOKER C functions, so that the role
 * that calls them is known (a SECURITY DEFINER function sees only its
 * owner): eg_queue_enter() notes the caller and then runs as the owner of
 * function fn_oid (the extension's owner, as SECURITY DEFINER would);
 * eg_queue_leave() goes back.  An ERROR goes back by itself (the
 * (sub)transaction's abort restores the user).
 */
extern void eg_queue_enter(EgQueueCaller *c, Oid fn_oid);
extern void eg_queue_leave(const EgQueueCaller *c);

/*
 * The id of queue event subscription "subscription" of "topic" when role
 * may receive from it (a member of eventgrid_receiver or eventgrid_admin,
 * or a role grant_receive() named for it or its topic), else ERROR 42501;
 * 42704 / 42809 when it may and there is no such queue subscription.  Run
 * by SPI (connected), as the owner, in a subtransaction rolled back
 * afterwards so that no lock stays: a waiting receive() holds none that
 * DDL needs.
 */
extern int64 eg_queue_subscription_for(Datum topic, Datum subscription, Oid role);

/*
 * Runs look(arg) in a subtransaction of the caller's transaction (SPI
 * connected), kept when look returns true, else rolled back with the locks
 * it took; an ERROR rolls it back and goes on up.
 */
extern void eg_queue_in_subxact(bool (*look) (void *arg), void *arg);

#endif
