#!/usr/bin/env bash
# Installs what the test suite needs beyond Go, on a Debian machine, and
# unpacks a Debian kernel for the VM tests into .vm/. Idempotent: quick when
# everything is already there. Without root or apt it says what is missing
# and carries on; the VM tests then skip with that reason.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && file /bin/busybox 2>/dev/null | grep -q static || [ -e /usr/share/doc/busybox-static ] || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v gcc >/dev/null || need+=(gcc)
command -v zsh >/dev/null || need+=(zsh)   # shell completion scripts are syntax-checked
command -v fish >/dev/null || need+=(fish)

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "setup: installing ${need[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -q >/dev/null
		apt-get install -y -q "${need[@]}" >/dev/null
	else
		echo "setup: missing ${need[*]} and cannot apt-get install them; VM tests will skip" >&2
	fi
fi

# A Debian kernel and its modules for the qemu VM tests (vsock, kmod).
if [ ! -f .vm/vmlinuz ] && command -v apt-get >/dev/null; then
	pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
	if [ -n "$pkg" ]; then
		echo "setup: fetching $pkg for the VM tests"
		rm -rf .vm/tmp && mkdir -p .vm/tmp
		(cd .vm/tmp && apt-get download -q "$pkg" >/dev/null)
		dpkg-deb -x .vm/tmp/*.deb .vm/tmp/root
		kver=${pkg#linux-image-}
		cp .vm/tmp/root/boot/vmlinuz-"$kver" .vm/vmlinuz.tmp
		rm -rf .vm/modules && mv .vm/tmp/root/lib/modules/"$kver" .vm/modules
		echo "$kver" > .vm/kernel-version
		mv .vm/vmlinuz.tmp .vm/vmlinuz
		rm -rf .vm/tmp
	else
		echo "setup: no linux-image package found; VM tests will skip" >&2
	fi
fi
echo "setup: test dependencies ready"
