// How kpng names what tenants own: tenant names, their tables in the kernel
// (kpng.<tenant>.<table>: a tenant name and a table name never hold a dot,
// and none of kpng's own tables has one, so no two owners can reach the same
// kernel name), and the key under which a tenant's content is isolated in a
// sync (beside the Services' "namespace/name" keys, which never hold ':').

/** a DNS label, as Kubernetes names are: what a tenant calls itself */
const TENANT_NAME = /^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$/;
/** a tenant's name for one of its tables */
const TABLE_NAME = /^[a-z][a-z0-9_-]{0,31}$/;
/** chains, sets and maps inside a tenant's table */
const OBJECT_NAME = /^[A-Za-z][A-Za-z0-9_-]{0,63}$/;

const TENANT_TABLE_PREFIX = 'kpng.';
const TENANT_KEY_PREFIX = 'tenant:';

export function tenantNameProblem(name: string): string | undefined {
  return TENANT_NAME.test(name) ? undefined : `tenant name ${JSON.stringify(name)}: a DNS label ([a-z0-9]([a-z0-9-]*[a-z0-9])?, at most 40 characters)`;
}

export function tableNameProblem(name: string): string | undefined {
  return TABLE_NAME.test(name) ? undefined : `table name ${JSON.stringify(name)}: [a-z][a-z0-9_-]*, at most 32 characters`;
}

export function objectNameProblem(what: string, name: string): string | undefined {
  return OBJECT_NAME.test(name) ? undefined : `${what} name ${JSON.stringify(name)}: [A-Za-z][A-Za-z0-9_-]*, at most 64 characters`;
}

/** the kernel's name of a tenant's table */
export function kernelTableName(tenant: string, table: string): string {
  return `${TENANT_TABLE_PREFIX}${tenant}.${table}`;
}

/** the tenant and its table name of a kernel table kpng named, or undefined for any other table */
export function tenantOfTable(kernelName: string): { tenant: string; table: string } | undefined {
  if (!kernelName.startsWith(TENANT_TABLE_PREFIX)) return undefined;
  const rest = kernelName.slice(TENANT_TABLE_PREFIX.length);
  const dot = rest.indexOf('.');
  if (dot < 0) return undefined;
  const tenant = rest.slice(0, dot);
  const table = rest.slice(dot + 1);
  return tenantNameProblem(tenant) || tableNameProblem(table) ? undefined : { tenant, table };
}

/** the key a tenant's content goes by in a sync (isolated like a Service's) */
export function tenantKey(tenant: string): string {
  return TENANT_KEY_PREFIX + tenant;
}

/** the tenant of a sync key, or undefined for a Service's */
export function tenantOfKey(key: string): string | undefined {
  return key.startsWith(TENANT_KEY_PREFIX) ? key.slice(TENANT_KEY_PREFIX.length) : undefined;
}
