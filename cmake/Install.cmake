# cmake --install and the .deb (./dev package, CPack): the binary, the desktop entry, icons,
# AppStream metainfo, the man page, the systemd unit for `serve` and its configuration.
include(GNUInstallDirs)

install(TARGETS idemdesk RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(IDEM_RESOURCES ${PROJECT_SOURCE_DIR}/resources)
install(FILES ${IDEM_RESOURCES}/idemdesk.desktop DESTINATION ${CMAKE_INSTALL_DATADIR}/applications)
install(FILES ${IDEM_RESOURCES}/idemdesk.metainfo.xml DESTINATION ${CMAKE_INSTALL_DATADIR}/metainfo
        RENAME io.github.idemdesk.IdempotencyDesk.metainfo.xml)
# Compressed, as Debian's policy has man pages and changelogs (gzip -n: the same bytes every build).
find_program(GZIP gzip REQUIRED)
foreach(pair "docs/idemdesk.1:idemdesk.1.gz" "resources/debian/changelog:changelog.gz")
    string(REPLACE ":" ";" pair ${pair})
    list(GET pair 0 source)
    list(GET pair 1 target)
    add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/${target}
        COMMAND ${GZIP} -9 -n -c ${PROJECT_SOURCE_DIR}/${source} > ${PROJECT_BINARY_DIR}/${target}
        DEPENDS ${PROJECT_SOURCE_DIR}/${source})
    list(APPEND idem_gzipped ${PROJECT_BINARY_DIR}/${target})
endforeach()
add_custom_target(idemdesk_gzipped ALL DEPENDS ${idem_gzipped})
install(FILES ${PROJECT_BINARY_DIR}/idemdesk.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)

# The icon: the SVG and the PNGs rendered from it (resources/icons, the same files the window
# uses), in the usual hicolor sizes.
install(FILES ${IDEM_RESOURCES}/icons/idemdesk.svg DESTINATION ${CMAKE_INSTALL_DATADIR}/icons/hicolor/scalable/apps)
foreach(size 16 22 24 32 48 64 128 256)
    install(FILES ${IDEM_RESOURCES}/icons/idemdesk-${size}.png
            DESTINATION ${CMAKE_INSTALL_DATADIR}/icons/hicolor/${size}x${size}/apps RENAME idemdesk.png)
endforeach()

# The configuration and the systemd unit, placed at install time: `cmake --install --prefix`
# may name another prefix than the one configured, so the paths follow the prefix installed to,
# with GNUInstallDirs' rule for the configuration folder: /etc for the /usr prefix (the .deb),
# /etc/opt/... for /opt/..., PREFIX/etc otherwise (/usr/local/etc; ~/.local/etc for a user,
# who never needs write access to /etc). The configuration is written only when there is none
# yet: an installed one holds the operator's endpoints and secrets (the .deb has it as a
# conffile: dpkg asks before replacing an edited one). It is root-only (0600): the unit hands
# it to the service as a credential. The unit goes where systemd looks for system units
# (/usr/lib/systemd/system, /usr/local/lib/systemd/system), its ExecStart and LoadCredential
# naming the binary and configuration actually installed; any other prefix gets no unit.
install(CODE "
    set(prefix \"\${CMAKE_INSTALL_PREFIX}\")
    if(IS_ABSOLUTE \"${CMAKE_INSTALL_SYSCONFDIR}\")
        set(sysconf \"${CMAKE_INSTALL_SYSCONFDIR}\")
    elseif(prefix STREQUAL \"/usr\")
        set(sysconf /etc)
    elseif(prefix MATCHES \"^/opt/\")
        set(sysconf \"/etc\${prefix}\")
    else()
        set(sysconf \"\${prefix}/${CMAKE_INSTALL_SYSCONFDIR}\")
    endif()
    set(config \"\${sysconf}/idemdesk/config.json\")
    if(EXISTS \"\$ENV{DESTDIR}\${config}\")
        message(STATUS \"Kept: \$ENV{DESTDIR}\${config} (already there; the new default is ${IDEM_RESOURCES}/systemd/config.json)\")
    else()
        file(INSTALL ${IDEM_RESOURCES}/systemd/config.json DESTINATION \"\${sysconf}/idemdesk\"
             FILE_PERMISSIONS OWNER_READ OWNER_WRITE)
    endif()
    if(prefix STREQUAL \"/usr\" OR prefix STREQUAL \"/usr/local\")
        set(CMAKE_INSTALL_FULL_BINDIR \"\${prefix}/${CMAKE_INSTALL_BINDIR}\")
        set(IDEM_CONFIG_FILE \"\${config}\")
        # Written straight to its place: nothing in the build tree changes at install time
        # (cpack and cmake --install may run side by side on one build).
        set(unit \"\$ENV{DESTDIR}\${prefix}/lib/systemd/system/idemdesk.service\")
        message(STATUS \"Installing: \${unit}\")
        configure_file(${IDEM_RESOURCES}/systemd/idemdesk.service.in \"\${unit}\" @ONLY)
    else()
        message(STATUS \"Skipped: the systemd unit (systemd reads system units under /usr and /usr/local only, not \${prefix})\")
    endif()")
install(FILES ${IDEM_RESOURCES}/prometheus/alerts.yml DESTINATION ${CMAKE_INSTALL_DATADIR}/idemdesk/prometheus)
install(FILES ${IDEM_RESOURCES}/debian/copyright ${PROJECT_BINARY_DIR}/changelog.gz
        DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/idemdesk)
install(FILES ${IDEM_RESOURCES}/debian/lintian-overrides DESTINATION ${CMAKE_INSTALL_DATADIR}/lintian/overrides
        RENAME idemdesk)

# The .deb: dependencies from the shared libraries the binary links (dpkg-shlibdeps).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME idemdesk)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Idempotency Desk developers <maintainers@idemdesk.example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "webhook receiver that processes each event once")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "Idempotency Desk receives webhooks, verifies their signatures,
claims each event's idempotency key atomically in a store (SQLite, Redis or
PostgreSQL), forwards the first delivery and gives every duplicate the stored
answer. A Qt dashboard, a headless receiver (with a hardened systemd unit and
Prometheus metrics) and an admin command line.")
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS OFF)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${IDEM_RESOURCES}/debian/conffiles ${IDEM_RESOURCES}/debian/postinst
    ${IDEM_RESOURCES}/debian/prerm ${IDEM_RESOURCES}/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/package)
include(CPack)
