/*
 * hooks.h - the hooks module.c installs from _PG_init (preloaded only):
 * hooks.c.
 */
#ifndef EVENTGRID_HOOKS_H
#define EVENTGRID_HOOKS_H

#include "core/eventgrid.h"

/* Installs the utility hook (DDL holds, extension changes, COMMIT PREPARED). */
extern void eg_ddl_holds_install(void);

/* Installs the error hook (context of eventgrid's internals, database names, permission hints). */
extern void eg_log_hook_install(void);

#endif							/* EVENTGRID_HOOKS_H */
