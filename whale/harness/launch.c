/* whale-launch: the one program between whale and a jail (whale/harness/launcher.py).

   whale-launch [-j FILE]... [-r RESOURCE:VALUE]... [-p PID] [-u UID] -- PROGRAM [ARG]...

   Each option in the order given, then PROGRAM is exec'd with the environment given:
   -j FILE   writes "0" to FILE (a run cgroup's cgroup.procs): this process joins the cgroup,
             and so does everything it starts, from its first instruction.
   -r R:V    setrlimit(R, {V, V}); R is the platform's RLIMIT_* number.
   -p PID    PR_SET_PDEATHSIG(SIGKILL), then exits if its parent is no longer PID (the parent
             died before the signal was armed). Not with -u: a change of uid clears it.
   -k        no keyrings: add_key, request_key and keyctl fail with ENOSYS from here on, for
             this process and all it starts (a seccomp filter; any other ABI than the native
             one is refused whole, so a compat call cannot get round it). The kernel's keyrings
             belong to no jail: a jailed process would share the session keyring of the whale
             that started it (possessing it: every right) and keep keys in its uid's user
             keyring, which the next run given that uid finds.
   -u UID    becomes UID for real, effective and saved uid and gid, with no supplementary
             groups, no_new_privs and no capabilities (permitted, effective, inheritable,
             ambient); checks that uid 0 cannot be regained.
   It replaces `sh` (joining the cgroups), `setpriv --pdeathsig`, `prlimit` and, inside the
   bubblewrap jail, `setpriv --reuid`, each an exec of its own. Any failure: a message on stderr
   and exit 126, before PROGRAM runs. Built by `make launcher` (part of make install): launcher.build(). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

static void fail(const char *what, const char *arg) {
	fprintf(stderr, "whale-launch: %s %s: %s\n", what, arg, errno ? strerror(errno) : "invalid");
	_exit(126);
}

static unsigned long long number(const char *text, unsigned long long max) {
	char *end;
	errno = 0;
	if (*text < '0' || *text > '9') fail("not a number:", text);
	unsigned long long v = strtoull(text, &end, 10);
	if (errno || *end || v > max) fail("not a number:", text);
	return v;
}

static void join(const char *file) {
	int fd = open(file, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "0", 1) != 1) fail("cannot join", file);
	close(fd);
}

static void limit(const char *spec) {
	const char *colon = strchr(spec, ':');
	if (colon == NULL || colon == spec) fail("bad rlimit", spec);
	char res[16];
	size_t n = (size_t)(colon - spec);
	if (n >= sizeof(res)) fail("bad rlimit", spec);
	memcpy(res, spec, n);
	res[n] = 0;
	struct rlimit rl;
	rl.rlim_cur = rl.rlim_max = (rlim_t)number(colon + 1, (unsigned long long)RLIM_INFINITY);
	if (setrlimit((int)number(res, RLIMIT_NLIMITS - 1), &rl) != 0) fail("cannot set rlimit", spec);
}

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#endif

static void no_keyrings(void) {
	struct sock_filter deny[] = {
#ifdef NATIVE_ARCH
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, 0, 6), /* another ABI: refused */
#else
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 0),
#endif
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 4, 0), /* x86's x32 ABI */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_add_key, 3, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_request_key, 2, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_keyctl, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
	};
	struct sock_fprog prog = {(unsigned short)(sizeof(deny) / sizeof(deny[0])), deny};
	/* root (CAP_SYS_ADMIN) needs no no_new_privs for a filter; anyone else does */
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0) return;
	if (errno != EACCES || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0)
		fail("seccomp filter for", "-k");
}

static void become(const char *text) {
	uid_t id = (uid_t)number(text, 0x7fffffff);
	if (id == 0) fail("refusing uid", text);
	if (setgroups(0, NULL) != 0) fail("setgroups for", text);
	if (setresgid(id, id, id) != 0) fail("setresgid", text);
	if (setresuid(id, id, id) != 0) fail("setresuid", text);
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("no_new_privs for", text);
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
		fail("clearing ambient capabilities for", text);
	struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3];
	memset(none, 0, sizeof(none));
	if (syscall(SYS_capset, &head, none) != 0) fail("clearing capabilities for", text);
	uid_t r, e, s;
	if (getresuid(&r, &e, &s) != 0 || r != id || e != id || s != id) fail("uid check", text);
	errno = 0;
	if (setuid(0) == 0) fail("uid 0 still reachable from", text);
}

int main(int argc, char **argv, char **envp) {
	int i = 1;
	for (; i < argc; i++) {
		const char *opt = argv[i];
		if (strcmp(opt, "--") == 0) break;
		if (strcmp(opt, "-k") == 0) { /* the one option without a value */
			no_keyrings();
			continue;
		}
		if (i + 1 >= argc || opt[0] != '-' || opt[1] == 0 || opt[2] != 0) fail("bad option", opt);
		const char *arg = argv[++i];
		switch (opt[1]) {
		case 'j':
			join(arg);
			break;
		case 'r':
			limit(arg);
			break;
		case 'p':
			if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) fail("pdeathsig", arg);
			if (getppid() != (pid_t)number(arg, 0x7fffffff)) _exit(126); /* parent gone */
			break;
		case 'u':
			become(arg);
			break;
		default:
			fail("bad option", opt);
		}
	}
	if (i + 1 >= argc) {
		errno = 0;
		fail("no program after", "--");
	}
	execve(argv[i + 1], argv + i + 1, envp);
	fail("cannot run", argv[i + 1]);
	return 126;
}
