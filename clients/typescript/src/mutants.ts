/**
 * Deliberately broken variants, for the tests' controls only (never set in production code): each
 * switch brings back a behaviour that a safety test must see fail.
 */
export const mutants = {
  /** The lease is marked lost only when a renewal is refused: no local deadline (rule K2 broken). */
  noLocalDeadline: false,
};
