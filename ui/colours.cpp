#include "colours.h"

#include <QApplication>
#include <QPalette>
#include <QProcess>
#include <QStyleFactory>

namespace idem {

bool paletteIsDark()
{
    // Qt's own palette decides: a dark window (what a dark platform theme, Adwaita-dark or
    // Yaru-dark through the GTK platform theme, or useDarkPalette() gives).
    const QPalette palette = QApplication::palette();
    const int window = palette.color(QPalette::Window).lightness();
    return window < 128 || window < palette.color(QPalette::WindowText).lightness();
}

QColor jsonColour(JsonPart part)
{
    const bool dark = paletteIsDark();
    switch (part) {
    case JsonPart::Key:
        return dark ? QColor(0xd2, 0xa8, 0xff) : QColor(0x88, 0x22, 0x88);
    case JsonPart::String:
        return stateColour(KeyState::Completed);
    case JsonPart::Number:
        return stateColour(KeyState::Reset);
    case JsonPart::Literal:
        return stateColour(KeyState::Processing);
    }
    return {};
}

QColor stateColour(KeyState state)
{
    const bool dark = paletteIsDark();
    switch (state) {
    case KeyState::Completed:
        return dark ? QColor(0x6c, 0xd6, 0x8a) : QColor(0x17, 0x73, 0x3a);
    case KeyState::Failed:
        return dark ? QColor(0xff, 0x7b, 0x72) : QColor(0xb0, 0x20, 0x20);
    case KeyState::Processing:
        return dark ? QColor(0xf0, 0xb4, 0x4c) : QColor(0x93, 0x57, 0x00);
    case KeyState::Reset:
        return dark ? QColor(0x79, 0xb8, 0xff) : QColor(0x1f, 0x5f, 0xb0);
    }
    return {};
}

QColor outcomeColour(Outcome outcome)
{
    switch (outcome) {
    case Outcome::Processed:
    case Outcome::Reprocessed:
    case Outcome::Recovered:
        return stateColour(KeyState::Completed);
    case Outcome::Replayed:
        return stateColour(KeyState::Reset);
    case Outcome::InProgress:
        return stateColour(KeyState::Processing);
    default:
        return stateColour(KeyState::Failed);
    }
}

QColor stuckBackground()
{
    return paletteIsDark() ? QColor(0x5a, 0x1e, 0x1e) : QColor(0xff, 0xe0, 0xe0);
}

QColor winnerBackground()
{
    return paletteIsDark() ? QColor(0x1e, 0x4a, 0x2c) : QColor(0xe3, 0xf4, 0xe8);
}

bool desktopWantsDark()
{
    // GTK_THEME=Adwaita:dark, Adwaita-dark, Yaru-dark, …
    if (qEnvironmentVariable("GTK_THEME").contains(u"dark"_qs, Qt::CaseInsensitive))
        return true;
    const QString desktop = qEnvironmentVariable("XDG_CURRENT_DESKTOP");
    if (desktop.contains(u"GNOME"_qs) || desktop.contains(u"Unity"_qs)) {
        // Run once at start, before the window exists; bounded so a broken gsettings cannot hang
        // it.
        // GNOME 42's color-scheme, or a dark GTK theme chosen by name (Yaru-dark, …).
        for (const QString &key : {u"color-scheme"_qs, u"gtk-theme"_qs}) {
            QProcess gsettings;
            gsettings.start(u"gsettings"_qs, {u"get"_qs, u"org.gnome.desktop.interface"_qs, key});
            if (gsettings.waitForFinished(1000) &&
                gsettings.readAllStandardOutput().toLower().contains("dark"))
                return true;
        }
    }
    return false;
}

void followDesktopColourScheme(QApplication &app)
{
    if (paletteIsDark() || !desktopWantsDark())
        return; // already dark (the platform theme follows the desktop), or light wanted
    useDarkPalette(app);
}

void useDarkPalette(QApplication &app)
{
    app.setStyle(QStyleFactory::create(u"Fusion"_qs));
    QPalette dark;
    const QColor window(0x2b, 0x2d, 0x30), base(0x1e, 0x1f, 0x22), text(0xe6, 0xe6, 0xe6);
    dark.setColor(QPalette::Window, window);
    dark.setColor(QPalette::WindowText, text);
    dark.setColor(QPalette::Base, base);
    dark.setColor(QPalette::AlternateBase, window);
    dark.setColor(QPalette::ToolTipBase, base);
    dark.setColor(QPalette::ToolTipText, text);
    dark.setColor(QPalette::Text, text);
    dark.setColor(QPalette::Button, window);
    dark.setColor(QPalette::ButtonText, text);
    dark.setColor(QPalette::BrightText, Qt::red);
    dark.setColor(QPalette::Link, QColor(0x79, 0xb8, 0xff));
    dark.setColor(QPalette::Highlight, QColor(0x2f, 0x6f, 0xc0));
    dark.setColor(QPalette::HighlightedText, Qt::white);
    dark.setColor(QPalette::PlaceholderText, QColor(0x9a, 0x9a, 0x9a));
    dark.setColor(QPalette::Disabled, QPalette::Text, QColor(0x80, 0x80, 0x80));
    dark.setColor(QPalette::Disabled, QPalette::ButtonText, QColor(0x80, 0x80, 0x80));
    dark.setColor(QPalette::Disabled, QPalette::WindowText, QColor(0x80, 0x80, 0x80));
    app.setPalette(dark);
}

QIcon applicationIcon()
{
    QIcon icon;
    for (int size : {16, 22, 24, 32, 48, 64, 128, 256})
        icon.addFile(u":/icons/idemdesk-%1.png"_qs.arg(size), QSize(size, size));
    return icon;
}

} // namespace idem
